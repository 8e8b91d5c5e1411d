//! Launch shapes of the tiled attention kernels ([`super::tiled`]): how many rows a cube owns,
//! how many rows each streamed tile has, how many units (threads) a cube runs, and which of
//! them fit a device's shared memory.
//!
//! By default each kernel takes the first shape that fits of [`mma_shapes`] (on devices with
//! NVIDIA's warp-level `mma`, for tensor-core products), then of [`DEFAULT_SHAPES`]. Another
//! choice can be set for the whole process, to measure shapes against each other (`reel bench
//! --attention-only --tiles ...`) or to run a training with the fastest one: [`set_tiles`], or
//! the `REEL_TILED_TILES` environment variable read at the first launch. A spec is
//! `RxC[xU]` (rows, cols, units; 128 units when left out) for all three kernels, or
//! comma-separated `kernel=RxC[xU]` entries (`forward`, `backward_q`, `backward_kv`), for
//! example `forward=64x64x128,backward_kv=32x64`. A chosen shape that does not fit the
//! device's shared memory falls back to the default choice, with one note on stderr.

use std::fmt;
use std::str::FromStr;
use std::sync::{Once, RwLock};

use super::fragments::{scores_hold_scratch, scratch_len};
use super::tile_ops::ALIGN;
use super::tiled_kernels::{PAD_FLOAT, PAD_OPERAND, TILE};

/// Units per cube by default: four planes (warps) of 32.
pub const UNITS: usize = 128;

/// Tile shapes tried by default, largest first.
pub const DEFAULT_SHAPES: [Tiles; 5] = [
    Tiles::new(64, 64, UNITS),
    Tiles::new(64, 32, UNITS),
    Tiles::new(32, 32, UNITS),
    Tiles::new(32, 16, UNITS),
    Tiles::new(16, 16, UNITS),
];

/// The tensor-core default of `kernel` on devices with NVIDIA's warp-level `m16n8k16`
/// ([`Cores::Mma`]), tried before [`DEFAULT_SHAPES`], fastest first: the `mp` kernels, which
/// an H100 ran 5.2× (forward) and 5.7× (forward + backward) faster than the 64x64x128
/// default (`reel bench --attention-only` at 8190 tokens, head dim 128, bf16;
/// `bench/results/2026-11-27-NVIDIA-H100-80GB-HBM3.md`). The 8-warp forward needs about
/// 102 KiB of shared memory; smaller devices get the 4-warp one (85 KiB).
pub fn mma_shapes(kernel: Kernel) -> &'static [Tiles] {
    const FORWARD: [Tiles; 2] = [
        Tiles::new(128, 64, 256).with_mma().with_prefetch(),
        Tiles::new(64, 64, UNITS).with_mma().with_prefetch(),
    ];
    const BACKWARD: [Tiles; 1] = [Tiles::new(64, 32, UNITS).with_mma().with_prefetch()];
    match kernel {
        Kernel::Forward => &FORWARD,
        Kernel::BackwardQ | Kernel::BackwardKv => &BACKWARD,
    }
}

/// The products a kernel runs on, as far as its launch shape is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cores {
    /// Unit (SIMT) products.
    Units,
    /// Tensor-core tile products, on a device without NVIDIA's warp-level `m16n8k16` for
    /// the dtype (the `m` kernels cannot run).
    TensorCores,
    /// Tensor-core products on a device with the warp-level `m16n8k16` (CUDA from compute
    /// capability 8.0).
    Mma,
}

impl Cores {
    /// Whether the products run on tensor cores.
    pub fn tensor(self) -> bool {
        self != Cores::Units
    }

    /// The shapes tried by default for `kernel`, in order.
    fn defaults(self, kernel: Kernel) -> impl Iterator<Item = Tiles> {
        let first = if self == Cores::Mma {
            mma_shapes(kernel)
        } else {
            &[]
        };
        first.iter().copied().chain(DEFAULT_SHAPES)
    }
}

/// The environment variable read for a tile choice when [`set_tiles`] was not called.
pub const TILES_ENV: &str = "REEL_TILED_TILES";

/// Which kernel a launch shape is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// [`tiled_forward`](fn@super::tiled_kernels::tiled_forward).
    Forward,
    /// [`tiled_backward_q`](fn@super::tiled_kernels::tiled_backward_q).
    BackwardQ,
    /// [`tiled_backward_kv`](fn@super::tiled_kernels::tiled_backward_kv).
    BackwardKv,
}

impl Kernel {
    /// The three kernels, in [`TileChoice`]'s order.
    pub const ALL: [Kernel; 3] = [Kernel::Forward, Kernel::BackwardQ, Kernel::BackwardKv];

    /// The name a tile spec uses.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Forward => "forward",
            Kernel::BackwardQ => "backward_q",
            Kernel::BackwardKv => "backward_kv",
        }
    }
}

/// One kernel's launch shape: each cube owns `rows` rows of one `(batch, head)`, streams tiles
/// of `cols` rows of the other sequence and runs `units` units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tiles {
    /// Rows a cube owns (queries in the forward and `dQ` pass, keys in the `dK`/`dV` pass).
    pub rows: usize,
    /// Rows of each streamed tile.
    pub cols: usize,
    /// Units per cube.
    pub units: usize,
    /// With tensor-core products: the forward's output and the backward's `dQ`, `dK`, `dV`
    /// sums stay in register fragments instead of shared memory (the `r` suffix of a spec;
    /// `fragments.rs`).
    pub registers: bool,
    /// Each streamed tile's global loads are issued while the previous tile computes (the `p`
    /// suffix of a spec): into registers (`staging::stream`; `cols × head dim / units` more
    /// elements of registers per unit and per streamed tensor, no more shared memory), or
    /// with `m`, by asynchronous copies (`cp.async`, `staging::copy_tile`) into a second
    /// buffer of each streamed tile (no registers, twice the streamed tiles' shared memory;
    /// where the inputs cannot be read in 16-byte vectors, the `m` kernels stage each tile
    /// when its turn comes instead).
    pub prefetch: bool,
    /// Each plane owns 16 of the cube's rows (the `w` suffix of a spec; `strips.rs`,
    /// `strips_backward.rs`), which needs `rows = 16 × units / 32`.
    pub strips: bool,
    /// The kernel runs on NVIDIA's `mma` instruction with its scores, probabilities and sums
    /// in registers (the `m` suffix of a spec; `mma_forward.rs`, `mma_backward.rs`), with
    /// `w`'s split of the rows (and its constraint); on devices without it the strips
    /// kernel runs in its place (`w`, where that fits).
    pub mma: bool,
}

impl Tiles {
    /// `rows × cols` tiles on `units` units.
    pub const fn new(rows: usize, cols: usize, units: usize) -> Self {
        Self {
            rows,
            cols,
            units,
            registers: false,
            prefetch: false,
            strips: false,
            mma: false,
        }
    }

    /// These tiles with the output and the backward's sums in registers (tensor-core
    /// products).
    pub const fn with_registers(self) -> Self {
        Self {
            registers: true,
            ..self
        }
    }

    /// These tiles with each streamed tile loaded while the previous one computes.
    pub const fn with_prefetch(self) -> Self {
        Self {
            prefetch: true,
            ..self
        }
    }

    /// These tiles on manual `mma` instructions.
    pub const fn with_mma(self) -> Self {
        Self { mma: true, ..self }
    }

    /// These tiles with the cube's rows split among the planes, 16 each.
    pub const fn with_strips(self) -> Self {
        Self {
            strips: true,
            ..self
        }
    }

    /// Why the kernels cannot split their work this way, if they cannot: both sides multiples
    /// of the 16-row tile, whole planes of 32 units, one unit per owned row and per streamed
    /// row at least (the per-row statistics), and the forward's softmax sharing each row among
    /// `units / rows` units that split its `cols` columns evenly.
    pub fn invalid(&self) -> Option<String> {
        let Tiles {
            rows, cols, units, ..
        } = *self;
        if rows == 0 || cols == 0 || rows % TILE != 0 || cols % TILE != 0 {
            return Some(format!("rows and cols must be multiples of {TILE}"));
        }
        if units == 0 || units % 32 != 0 || units > 1024 {
            return Some("units must be a multiple of 32, at most 1024".into());
        }
        if rows > units || cols > units {
            return Some("rows and cols must not exceed units".into());
        }
        if units % rows != 0 || cols % (units / rows) != 0 {
            return Some("units / rows must be a whole number that divides cols".into());
        }
        if (self.strips || self.mma) && rows != TILE * units / 32 {
            let flag = if self.mma { "m" } else { "w" };
            return Some(format!(
                "with {flag}, rows must be {TILE} per plane of 32 units"
            ));
        }
        None
    }
}

impl fmt::Display for Tiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = if self.registers { "r" } else { "" };
        let p = if self.prefetch { "p" } else { "" };
        let w = if self.strips { "w" } else { "" };
        let m = if self.mma { "m" } else { "" };
        write!(f, "{}x{}x{}{r}{p}{w}{m}", self.rows, self.cols, self.units)
    }
}

/// A tile spec that does not parse or names shapes the kernels cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tile spec {spec:?}: {reason} (expected RxC[xU][r][p][w][m] or kernel=RxC[xU][r][p][w][m],..., kernels forward, backward_q, backward_kv)")]
pub struct TileSpecError {
    /// The spec as given.
    pub spec: String,
    /// What is wrong with it.
    pub reason: String,
}

impl FromStr for Tiles {
    type Err = TileSpecError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |reason: String| TileSpecError {
            spec: s.into(),
            reason,
        };
        // Flags after the numbers, in any order: `r` (registers), `p` (prefetch), `w`
        // (plane-owned strips), `m` (manual `mma`).
        let spec = s.trim();
        let t = spec.trim_end_matches(['r', 'p', 'w', 'm']);
        let flags = &spec[t.len()..];
        let nums: Vec<usize> = t
            .split('x')
            .map(|n| n.trim().parse::<usize>())
            .collect::<Result<_, _>>()
            .map_err(|e| err(format!("not a number ({e})")))?;
        let mut tiles = match nums[..] {
            [rows, cols] => Tiles::new(rows, cols, UNITS),
            [rows, cols, units] => Tiles::new(rows, cols, units),
            _ => return Err(err("two or three numbers".into())),
        };
        tiles.registers = flags.contains('r');
        tiles.prefetch = flags.contains('p');
        tiles.strips = flags.contains('w');
        tiles.mma = flags.contains('m');
        match tiles.invalid() {
            Some(reason) => Err(err(reason)),
            None => Ok(tiles),
        }
    }
}

/// A launch shape per kernel (`None`: the default choice), in [`Kernel::ALL`]'s order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TileChoice(pub [Option<Tiles>; 3]);

impl TileChoice {
    /// The chosen shape of `kernel`, if any.
    pub fn get(&self, kernel: Kernel) -> Option<Tiles> {
        self.0[kernel as usize]
    }
}

impl FromStr for TileChoice {
    type Err = TileSpecError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut choice = TileChoice::default();
        if !s.contains('=') {
            choice.0 = [Some(s.parse()?); 3];
            return Ok(choice);
        }
        for entry in s.split(',') {
            let (name, tiles) = entry.split_once('=').ok_or_else(|| TileSpecError {
                spec: s.into(),
                reason: format!("entry {entry:?} has no `kernel=`"),
            })?;
            let kernel = Kernel::ALL
                .into_iter()
                .find(|k| k.name() == name.trim())
                .ok_or_else(|| TileSpecError {
                    spec: s.into(),
                    reason: format!("unknown kernel {name:?}"),
                })?;
            choice.0[kernel as usize] = Some(tiles.parse()?);
        }
        Ok(choice)
    }
}

impl fmt::Display for TileChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c] = self.0;
        if let Some(all) = a.filter(|_| a == b && b == c) {
            return write!(f, "{all}");
        }
        let parts: Vec<String> = Kernel::ALL
            .into_iter()
            .filter_map(|k| self.get(k).map(|t| format!("{}={t}", k.name())))
            .collect();
        write!(f, "{}", parts.join(","))
    }
}

/// The process-wide choice: `None` until set or read from [`TILES_ENV`].
static CHOICE: RwLock<Option<TileChoice>> = RwLock::new(None);

/// Choose the launch shapes of every later tiled launch in this process (`TileChoice::default()`:
/// the default choice again).
pub fn set_tiles(choice: TileChoice) {
    *CHOICE.write().unwrap_or_else(|e| e.into_inner()) = Some(choice);
}

/// The process-wide choice, read from [`TILES_ENV`] the first time (a spec that does not
/// parse is reported once on stderr and ignored).
pub fn tiles_choice() -> TileChoice {
    if let Some(choice) = *CHOICE.read().unwrap_or_else(|e| e.into_inner()) {
        return choice;
    }
    let choice = match std::env::var(TILES_ENV) {
        Ok(spec) => spec.parse().unwrap_or_else(|e: TileSpecError| {
            eprintln!("reel: {TILES_ENV}: {e}; using the default tile shapes");
            TileChoice::default()
        }),
        Err(_) => TileChoice::default(),
    };
    let mut slot = CHOICE.write().unwrap_or_else(|e| e.into_inner());
    *slot.get_or_insert(choice)
}

/// Shared memory in bytes of `kernel` for `tiles`, padded head dims `dp`/`dvp` and operands
/// of `elem` bytes (its `SharedMemory` arrays, with their padded rows), with tensor-core
/// products (`tc`: where the backward's sums can stay in registers, and where `m` runs) or
/// unit products (where `m` is counted as `w`, the kernels that run in its place).
pub fn shared_bytes(
    kernel: Kernel,
    tiles: Tiles,
    dp: usize,
    dvp: usize,
    elem: usize,
    tc: bool,
) -> usize {
    let Tiles {
        rows, cols, units, ..
    } = tiles;
    // The backward's float32 sums: a matrix per sum, or in registers, leaving through one
    // scratch tile per plane (in the score matrix when that is large enough).
    let regs = tc && tiles.registers;
    let sums = |widths: &[usize]| match regs {
        true if scores_hold_scratch(rows, cols, units) => 0,
        true => scratch_len(units),
        false => widths.iter().map(|&w| rows * (w + PAD_FLOAT)).sum(),
    };
    // Padded row lengths: operand matrices (`F`) and float32 matrices.
    let op = |w: usize| w + PAD_OPERAND;
    let fl = |w: usize| w + PAD_FLOAT;
    let staged = rows * op(dp) + cols * op(dp) + cols * op(dvp);
    if tc && tiles.mma {
        // The staged tiles (`dO` too in the backward) and the backward's row statistics; with
        // `p`, a second buffer of the streamed tiles (and of their statistics) and the two
        // buffers' barriers: 8 bytes each, which take a 32-byte aligned slot when CubeCL
        // places them before an array (its order varies), 16 bytes when after.
        let (buffers, barriers) = if tiles.prefetch { (2, ALIGN) } else { (1, 0) };
        let streamed = (buffers - 1) * cols * (op(dp) + op(dvp));
        return barriers
            + match kernel {
                Kernel::Forward => (staged + streamed) * elem,
                Kernel::BackwardQ => (staged + streamed + rows * op(dvp)) * elem + 2 * rows * 4,
                Kernel::BackwardKv => {
                    (staged + streamed + rows * op(dvp)) * elem + buffers * 2 * cols * 4
                }
            };
    }
    let (operands, floats) = match kernel {
        Kernel::Forward => (
            staged + rows * op(cols),
            rows * fl(cols) + rows * fl(dvp) + 3 * rows + units,
        ),
        Kernel::BackwardQ => (
            staged + rows * op(dvp) + rows * op(cols),
            2 * rows * fl(cols) + sums(&[dp]) + 2 * rows,
        ),
        Kernel::BackwardKv => (
            staged + rows * op(dvp) + 2 * rows * op(cols),
            2 * rows * fl(cols) + sums(&[dp, dvp]) + 2 * cols,
        ),
    };
    operands * elem + floats * 4
}

/// Head dims rounded up to the tile side.
pub fn padded(d: usize) -> usize {
    d.div_ceil(TILE) * TILE
}

/// The launch shape of `kernel` for head dims `d`/`dv`, operands of `elem` bytes, `have`
/// bytes of shared memory per cube and products on `cores`: the process-wide choice where it
/// is valid ([`Tiles::invalid`]) and fits, else the first default that fits (the module
/// doc); `None` when none does.
pub fn tile_shape(
    kernel: Kernel,
    d: usize,
    dv: usize,
    elem: usize,
    have: usize,
    cores: Cores,
) -> Option<Tiles> {
    shape_with(tiles_choice(), kernel, d, dv, elem, have, cores)
}

/// [`tile_shape`] with `choice` in place of the process-wide one.
pub fn shape_with(
    choice: TileChoice,
    kernel: Kernel,
    d: usize,
    dv: usize,
    elem: usize,
    have: usize,
    cores: Cores,
) -> Option<Tiles> {
    let (dp, dvp, tc) = (padded(d), padded(dv), cores.tensor());
    let fits = |t: &Tiles| shared_bytes(kernel, *t, dp, dvp, elem, tc) <= have;
    if let Some(chosen) = choice.get(kernel) {
        // A choice made in code (`set_tiles`) skipped the parser's checks; the kernels index
        // shared memory by these shapes, unchecked, so an invalid one never launches.
        let why = match chosen.invalid() {
            Some(reason) => reason,
            None if fits(&chosen) => return Some(chosen),
            None => format!(
                "need {} bytes of shared memory, the device has {have}",
                shared_bytes(kernel, chosen, dp, dvp, elem, tc)
            ),
        };
        static NOTE: Once = Once::new();
        NOTE.call_once(|| {
            eprintln!(
                "reel: tiled attention: {} tiles {chosen}: {why}; using the default shapes",
                kernel.name()
            )
        });
    }
    cores.defaults(kernel).find(fits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_shapes_fit_and_shrink_with_shared_memory() {
        // The default choice, whatever other tests of this binary set process-wide.
        let shape = |kernel, d, dv, elem, have, cores| {
            shape_with(TileChoice::default(), kernel, d, dv, elem, have, cores)
        };
        // Wan's head dim 128 in bf16 on an H100 (227 KiB per cube): the first `mma` shape,
        // or the largest tiles where the `m` kernels cannot run.
        for kernel in Kernel::ALL {
            let got = shape(kernel, 128, 128, 2, 227 << 10, Cores::Mma);
            assert_eq!(got, Some(mma_shapes(kernel)[0]), "{kernel:?}");
            let got = shape(kernel, 128, 128, 2, 227 << 10, Cores::TensorCores);
            assert_eq!(got, Some(DEFAULT_SHAPES[0]), "{kernel:?}");
        }
        // An RTX 30's 99 KiB: the 8-warp `mp` forward does not fit, the 4-warp one does.
        let forward = shape(Kernel::Forward, 128, 128, 2, 99 << 10, Cores::Mma);
        assert_eq!(forward, Some(mma_shapes(Kernel::Forward)[1]));
        // 48 KiB: smaller tiles, each within the budget.
        for kernel in Kernel::ALL {
            for (d, dv, elem, cores) in [
                (128, 128, 2, Cores::Mma),
                (64, 64, 4, Cores::Units),
                (24, 8, 4, Cores::Units),
            ] {
                let t = shape(kernel, d, dv, elem, 48 << 10, cores).expect("fits");
                let bytes = shared_bytes(kernel, t, padded(d), padded(dv), elem, cores.tensor());
                assert!(bytes <= 48 << 10, "{t}: {bytes} bytes");
                assert!(t.invalid().is_none(), "{t}");
            }
        }
        assert_eq!(
            shape(Kernel::BackwardKv, 512, 512, 4, 32 << 10, Cores::Units),
            None
        );
        assert_eq!(padded(5), 16);
        assert_eq!(padded(128), 128);
        for kernel in Kernel::ALL {
            for t in mma_shapes(kernel).iter().chain(&DEFAULT_SHAPES) {
                assert!(t.invalid().is_none(), "{t}");
            }
        }
    }

    #[test]
    fn a_choice_made_in_code_launches_only_when_valid() {
        // Strips of 16 rows per warp on 4 warps need 64 rows, not 32: `set_tiles` takes any
        // `Tiles`, but the kernels never launch with it.
        let bad = Tiles::new(32, 64, 128).with_strips();
        assert!(bad.invalid().is_some());
        // Head dim 128 in bf16 with tensor cores on an H100's 227 KiB.
        let launch = |t, kernel| {
            shape_with(
                TileChoice([Some(t); 3]),
                kernel,
                128,
                128,
                2,
                227 << 10,
                Cores::TensorCores,
            )
        };
        for kernel in Kernel::ALL {
            assert_eq!(launch(bad, kernel), Some(DEFAULT_SHAPES[0]), "{kernel:?}");
        }
        let good = Tiles::new(64, 64, 128).with_strips();
        assert_eq!(launch(good, Kernel::Forward), Some(good));
    }

    #[test]
    fn manual_mma_kernels_hold_only_their_staged_tiles() {
        // With tensor cores `m` holds the staged operand tiles (and the backward's two
        // statistics per row), `mp` two buffers of the streamed ones; without tensor cores,
        // `m` is counted as the strips kernels that run instead.
        let (d, dv, elem) = (128, 64, 2);
        let (op_d, op_dv) = (d + PAD_OPERAND, dv + PAD_OPERAND);
        for (rows, cols, units) in [(64, 64, 128), (64, 32, 128), (128, 32, 256)] {
            let m = Tiles::new(rows, cols, units).with_mma();
            let w = Tiles::new(rows, cols, units).with_strips();
            let bytes = |kernel, t, tc| shared_bytes(kernel, t, d, dv, elem, tc);
            let staged = (rows + cols) * op_d + cols * op_dv;
            assert_eq!(bytes(Kernel::Forward, m, true), staged * elem);
            let backward = (staged + rows * op_dv) * elem;
            assert_eq!(bytes(Kernel::BackwardQ, m, true), backward + 2 * rows * 4);
            assert_eq!(bytes(Kernel::BackwardKv, m, true), backward + 2 * cols * 4);
            // `p`: a second buffer of the streamed tiles and statistics, and the two 8-byte
            // barriers in an aligned 32-byte slot.
            let mp = m.with_prefetch();
            let second = cols * (op_d + op_dv) * elem + 32;
            assert_eq!(bytes(Kernel::Forward, mp, true), staged * elem + second);
            assert_eq!(
                bytes(Kernel::BackwardQ, mp, true),
                backward + 2 * rows * 4 + second
            );
            let kv = backward + 4 * cols * 4 + second;
            assert_eq!(bytes(Kernel::BackwardKv, mp, true), kv);
            for kernel in Kernel::ALL {
                assert_eq!(
                    bytes(kernel, m, false),
                    bytes(kernel, w, false),
                    "{kernel:?}"
                );
                assert!(
                    bytes(kernel, m, true) < bytes(kernel, w, true),
                    "{kernel:?}"
                );
            }
        }
    }

    #[test]
    fn register_sums_free_the_backwards_float32_matrices() {
        // Head dim 128 in bf16, 64x64 tiles on 128 units: each backward sum was a 64 x 132
        // float32 matrix; in registers they leave through the (by then free) score matrix.
        let (plain, regs) = (
            Tiles::new(64, 64, 128),
            Tiles::new(64, 64, 128).with_registers(),
        );
        for (kernel, sums) in [(Kernel::BackwardQ, 1), (Kernel::BackwardKv, 2)] {
            let bytes = |t, tc| shared_bytes(kernel, t, 128, 128, 2, tc);
            assert_eq!(bytes(plain, true) - bytes(regs, true), sums * 64 * 132 * 4);
            // A 16-row cube's score matrix is too small: one 16 x 20 scratch tile per plane.
            let t16 = Tiles::new(16, 16, 128);
            let scratch = 4 * 16 * 20 * 4;
            let freed = bytes(t16, true) - bytes(t16.with_registers(), true);
            assert_eq!(freed, sums * 16 * 132 * 4 - scratch);
            // Unit products keep the matrices, whatever the spec says.
            assert_eq!(bytes(regs, false), bytes(plain, false));
            // Planes owning strips (`w`) free the same.
            let (strips, both) = (plain.with_strips(), regs.with_strips());
            assert_eq!(bytes(strips, true) - bytes(both, true), sums * 64 * 132 * 4);
        }
        // The forward keeps its output matrix: the fragments are rescaled and leave through it.
        let forward = |t| shared_bytes(Kernel::Forward, t, 128, 128, 2, true);
        assert_eq!(forward(regs), forward(plain));
        // Two `dQ` cubes fit an H100's multiprocessor (228 KiB, 1 KiB reserved per cube).
        let dq = shared_bytes(Kernel::BackwardQ, regs, 128, 128, 2, true);
        assert!(2 * (dq + 1024) <= 228 << 10, "{dq}");
    }

    #[test]
    fn tile_specs_parse_and_name_what_is_wrong() {
        let all: TileChoice = "32x64".parse().unwrap();
        assert_eq!(all.0, [Some(Tiles::new(32, 64, UNITS)); 3]);
        assert_eq!(all.to_string(), "32x64x128");
        let some: TileChoice = "forward=64x64x256, backward_kv=32x32".parse().unwrap();
        assert_eq!(some.get(Kernel::Forward), Some(Tiles::new(64, 64, 256)));
        assert_eq!(some.get(Kernel::BackwardQ), None);
        assert_eq!(
            some.get(Kernel::BackwardKv),
            Some(Tiles::new(32, 32, UNITS))
        );
        assert_eq!(
            some.to_string().parse::<TileChoice>().unwrap(),
            some,
            "{some}"
        );
        let regs: TileChoice = "backward_q=64x64r".parse().unwrap();
        let want = Tiles::new(64, 64, UNITS).with_registers();
        assert_eq!(regs.get(Kernel::BackwardQ), Some(want));
        assert_eq!(regs.to_string(), "backward_q=64x64x128r");
        for spec in ["32x64x256rp", "32x64x256pr"] {
            let both: Tiles = spec.parse().unwrap();
            let want = Tiles::new(32, 64, 256).with_registers().with_prefetch();
            assert_eq!(both, want, "{spec}");
            assert_eq!(both.to_string(), "32x64x256rp");
        }
        let fetch: Tiles = "64x32p".parse().unwrap();
        assert_eq!(fetch, Tiles::new(64, 32, UNITS).with_prefetch());
        let strips: Tiles = "128x64x256wp".parse().unwrap();
        assert_eq!(
            strips,
            Tiles::new(128, 64, 256).with_prefetch().with_strips()
        );
        assert_eq!(strips.to_string(), "128x64x256pw");
        let all: Tiles = "64x64x128wrp".parse().unwrap();
        let want = Tiles::new(64, 64, 128)
            .with_registers()
            .with_prefetch()
            .with_strips();
        assert_eq!(all, want);
        assert_eq!(all.to_string(), "64x64x128rpw");
        let mma: TileChoice = "forward=128x64x256m".parse().unwrap();
        let want = Tiles::new(128, 64, 256).with_mma();
        assert_eq!(mma.get(Kernel::Forward), Some(want));
        assert_eq!(mma.to_string(), "forward=128x64x256m");
        for (spec, says) in [
            ("64", "two or three numbers"),
            ("64xa", "not a number"),
            ("64x64q", "not a number"),
            ("40x64", "multiples of 16"),
            ("64x64x100", "multiple of 32"),
            ("64x64x32", "must not exceed units"),
            ("32x16x96", "divides cols"),
            ("32x64x128w", "16 per plane"),
            ("32x64x128m", "with m, rows must be 16 per plane"),
            ("sideways=64x64", "unknown kernel"),
            ("forward=64x64,32x32", "has no `kernel=`"),
        ] {
            let err = spec.parse::<TileChoice>().unwrap_err();
            assert!(err.to_string().contains(says), "{spec}: {err}");
            assert!(err.to_string().contains(spec), "{spec}: {err}");
        }
    }
}
