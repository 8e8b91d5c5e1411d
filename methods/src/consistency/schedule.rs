//! Multi-phase schedules: how many phases consistency distillation uses at each step.
//!
//! The format is FastVideo's `--multi_phased_distill_schedule`: comma-separated
//! `<step>-<phases>` entries with strictly increasing steps, e.g. `"2000-2,4000-4,6000-8"`. An
//! entry covers the (1-based) steps up to and including its step, so with that schedule steps
//! 1–2000 use 2 phases, 2001–4000 use 4, and every step after 4000 uses 8; the last entry's
//! phase count continues past its step. Reel also accepts a bare count (`"4"`) for a constant
//! phase count.

use std::fmt;
use std::str::FromStr;

/// A parsed multi-phase schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PhaseSchedule {
    /// `(last 1-based step, phases)` entries, steps strictly increasing; a bare count is
    /// stored as `(u64::MAX, phases)`.
    entries: Vec<(u64, usize)>,
}

impl PhaseSchedule {
    /// A constant phase count.
    pub fn constant(phases: usize) -> Self {
        Self {
            entries: vec![(u64::MAX, phases)],
        }
    }

    /// Phases used by 0-based global step `step` (FastVideo's 1-based step `step + 1`).
    pub fn phases_at(&self, step: u64) -> usize {
        self.entries
            .iter()
            .find(|(last, _)| step < *last)
            .or(self.entries.last())
            .map(|&(_, n)| n)
            .expect("a parsed schedule has at least one entry")
    }

    /// The phase count of the last entry (the count the finished model is trained for).
    pub fn final_phases(&self) -> usize {
        self.entries.last().map(|&(_, n)| n).expect("non-empty")
    }

    /// The largest phase count of any entry.
    pub fn max_phases(&self) -> usize {
        self.entries
            .iter()
            .map(|&(_, n)| n)
            .max()
            .expect("non-empty")
    }
}

impl FromStr for PhaseSchedule {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let text = s.trim();
        if is_digits(text) {
            return match text.parse::<usize>() {
                Ok(0) => Err("a phase count must be at least 1, got 0".into()),
                Ok(n) => Ok(Self::constant(n)),
                Err(_) => Err(format!("the phase count {text} is too large")),
            };
        }
        let mut entries: Vec<(u64, usize)> = Vec::new();
        for (k, part) in text.split(',').enumerate() {
            let part = part.trim();
            let bad = |why: &str| {
                format!(
                    "entry {} (`{part}`): {why}; expected `<step>-<phases>` entries such as \
                     \"2000-2,4000-4,6000-8\", or a bare phase count such as \"4\"",
                    k + 1
                )
            };
            let (step, phases) = part
                .split_once('-')
                .ok_or_else(|| bad("no `-` between step and phases"))?;
            let step: u64 = whole(step, "step").map_err(|why| bad(&why))?;
            let phases: usize = whole(phases, "phase count").map_err(|why| bad(&why))?;
            if step == 0 {
                return Err(bad("steps count from 1"));
            }
            if phases == 0 {
                return Err(bad("a phase count must be at least 1"));
            }
            if let Some(&(prev, _)) = entries.last() {
                if step <= prev {
                    return Err(bad(&format!("steps must increase, {step} follows {prev}")));
                }
            }
            entries.push((step, phases));
        }
        Ok(Self { entries })
    }
}

/// Whether `text` is a non-empty run of ASCII digits.
fn is_digits(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())
}

/// Parses a whole number, telling "too large" apart from "not a number".
fn whole<T: FromStr>(text: &str, what: &str) -> Result<T, String> {
    let text = text.trim();
    text.parse().map_err(|_| {
        if is_digits(text) {
            format!("the {what} {text} is too large")
        } else {
            format!("the {what} is not a whole number")
        }
    })
}

impl fmt::Display for PhaseSchedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .entries
            .iter()
            .map(|&(step, n)| {
                if step == u64::MAX {
                    n.to_string()
                } else {
                    format!("{step}-{n}")
                }
            })
            .collect();
        f.write_str(&parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fastvideo_format_by_hand() {
        let s: PhaseSchedule = "2000-2,4000-4,6000-8".parse().unwrap();
        // 0-based step s is FastVideo's step s + 1.
        for (step, want) in [
            (0, 2),
            (1999, 2),
            (2000, 4),
            (3999, 4),
            (4000, 8),
            (5999, 8),
            (6000, 8),
            (1_000_000, 8),
        ] {
            assert_eq!(s.phases_at(step), want, "step {step}");
        }
        assert_eq!(s.final_phases(), 8);
        assert_eq!(s.max_phases(), 8);
        assert_eq!(s.to_string(), "2000-2,4000-4,6000-8");
        // Decreasing phase counts are allowed; whitespace is ignored.
        let s: PhaseSchedule = " 10-8 , 20-4 ".parse().unwrap();
        assert_eq!(
            (s.phases_at(9), s.phases_at(10), s.phases_at(99)),
            (8, 4, 4)
        );
        assert_eq!(s.max_phases(), 8);
    }

    #[test]
    fn bare_count_is_constant() {
        let s: PhaseSchedule = "4".parse().unwrap();
        assert_eq!(s, PhaseSchedule::constant(4));
        assert_eq!((s.phases_at(0), s.phases_at(u64::MAX - 1)), (4, 4));
        assert_eq!(s.to_string(), "4");
    }

    #[test]
    fn malformed_schedules_say_what_is_wrong() {
        for (text, want) in [
            ("", "entry 1"),
            ("0", "at least 1"),
            ("2000-", "phase count is not a whole number"),
            ("2000-2,", "entry 2"),
            ("2000-x", "phase count is not a whole number"),
            ("a-2", "step is not a whole number"),
            ("0-2", "steps count from 1"),
            ("100-0", "at least 1"),
            ("200-2,100-4", "steps must increase, 100 follows 200"),
            ("200-2,200-4", "steps must increase"),
            ("-5-2", "step is not a whole number"),
            (
                "99999999999999999999999",
                "phase count 99999999999999999999999 is too large",
            ),
            (
                "5-99999999999999999999999",
                "phase count 99999999999999999999999 is too large",
            ),
            (
                "99999999999999999999999-4",
                "step 99999999999999999999999 is too large",
            ),
        ] {
            let e = text.parse::<PhaseSchedule>().unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }
}
