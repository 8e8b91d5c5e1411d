"""The results of `bench/gpu.sh` from its run manifest: `<out>.json` and a markdown `<out>.md`.

    python3 bench/gpu_summary.py MANIFEST OUT GPU DATE PLAN BUDGET_S

Each manifest line is one job (`kind` reel | torch | breakdown | encoder | attention |
torch-attention | matmul | kernels, its settings, the `file` holding its `--json` output, the exit status `rc` or
"skipped", the GPU memory peak `mem`, its wall time `secs`). The run times are listed last
(JSON `timeline`), so that the next session can plan what fits its budget. Reel rows are joined with the PyTorch run of the same
shape, dtype and checkpointing. Reel's notes on stderr (`reel: ...`, e.g. a kernel that cannot
run and what runs instead) are kept with each job's results and listed under the tables.
"""

import json
import os
import re
import sys


def load(path):
    try:
        return json.load(open(path))
    except Exception:
        return None


def err_lines(job):
    try:
        return [l for l in open(job["file"] + ".err").read().splitlines() if l.strip()]
    except Exception:
        return []


def last_step(lines):
    """The last step the run finished, from `reel bench`'s progress lines on stderr."""
    steps = [l[len("bench: "):] for l in lines if l.startswith("bench: ")]
    return f" (last finished: {steps[-1]})" if steps else ""


def error(job):
    if job["rc"] == "skipped":
        # bench/gpu.sh's skip_job names its reason (e.g. no `transformers` for UMT5).
        return "skipped: " + job.get("reason", "time budget spent")
    lines = err_lines(job)
    if job["rc"] == "124":
        return ("stopped: time budget spent" + last_step(lines))[:300]
    # A panic's message is the line after `thread '..' panicked at`; Reel's out-of-memory
    # hint (src/panic_hint.rs) marks a failed device allocation.
    panics = [i for i, l in enumerate(lines) if " panicked at " in l and i + 1 < len(lines)]
    msg = ("panicked: " + lines[panics[-1] + 1] if panics
           else lines[-1] if lines else f"failed (exit {job['rc']})")
    if any(l.startswith("reel: the device ran out of memory") for l in lines):
        msg = "out of device memory: " + msg
    return (msg + last_step(lines))[:300]


def notes(job):
    """Reel's one-time notes on stderr (which kernels fell back, and why)."""
    return sorted({l for l in err_lines(job) if l.startswith("reel: ")})


def mib(job):
    return float(job["mem"]) if job.get("mem") else None


def first(job):
    data = load(job["file"]) if job["rc"] == "0" else None
    return data[0] if data else None


def rows_of(jobs, gpu, date):
    torch = {(j["shape"], j["dtype"], j["ckpt"]): j for j in jobs if j["kind"] == "torch"}
    rows = []
    for j in (j for j in jobs if j["kind"] == "reel"):
        r = first(j)
        tj = torch.get((j["shape"], j["dtype"], j["ckpt"]))
        t = first(tj) if tj else None
        # A run with REEL_GPU_MEMORY set names its mode beside the variant.
        variant = j["variant"] + (f", {j['memory']} memory" if j.get("memory") else "")
        row = dict(device=gpu, date=date, variant=variant, attention=j["attention"],
                   dtype=j["dtype"], gradient_checkpointing=j["ckpt"] == "1",
                   shape=[int(x) for x in j["shape"].split(",")],
                   tokens=r["tokens"] if r else None,
                   reel_step_ms=r["train_step_ms"]["median"] if r else None,
                   reel_forward_ms=r["forward_ms"]["median"] if r else None,
                   reel_gpu_mib=mib(j),
                   torch_step_ms=t["train_step_ms"]["median"] if t else None,
                   torch_forward_ms=t["forward_ms"]["median"] if t else None,
                   torch_gpu_mib=mib(tj) if tj else None)
        row["ratio"] = (row["reel_step_ms"] / row["torch_step_ms"]
                        if row["reel_step_ms"] and row["torch_step_ms"] else None)
        row["notes"] = notes(j)
        if r is None:
            row["error"] = error(j)
        if tj and t is None:
            row["torch_error"] = error(tj)
        rows.append(row)
    return rows


def breakdowns_of(jobs):
    out = []
    for j in (j for j in jobs if j["kind"] == "breakdown"):
        b = first(j) or dict(error=error(j))
        b.update(method=j["method"], variant=j["variant"], gpu_mib=mib(j), notes=notes(j))
        if "attention" in j:
            b["attention"] = j["attention"]
        out.append(b)
    return out


def encoders_of(jobs):
    """Reel's encoder rows then PyTorch's (`torch-encoder`), each Reel row with `torch_ms`, the
    median of PyTorch's row of the same op and arguments (`run`: the Reel run's arguments
    without its environment words, as gpu.sh passed them to PyTorch)."""
    out = []
    for kind, name in (("encoder", "Reel"), ("torch-encoder", "PyTorch")):
        for j in (j for j in jobs if j["kind"] == kind):
            data = load(j["file"]) if j["rc"] == "0" else None
            for e in data or [dict(op=j["args"], error=error(j))]:
                e.update(args=j["args"], run=j.get("run", j["args"]), impl=name,
                         gpu_mib=mib(j), notes=notes(j))
                out.append(e)
    torch = {(e["run"], e["op"]): e["ms"]["median"]
             for e in out if e["impl"] == "PyTorch" and "error" not in e}
    for e in out:
        if e["impl"] == "Reel" and "error" not in e:
            e["torch_ms"] = torch.get((e["run"], e["op"]))
    return out


def attention_of(jobs):
    """The attention-alone rows: PyTorch's and every Reel kernel's, per shape."""
    out = []
    for j in (j for j in jobs if j["kind"] in ("attention", "torch-attention")):
        data = load(j["file"]) if j["rc"] == "0" else None
        name = "torch sdpa" if j["kind"] == "torch-attention" else f"reel ({j['variant']})"
        for a in data or [dict(kernel=name, error=error(j))]:
            a.update(latent=j["shape"], gpu_mib=mib(j), notes=notes(j))
            out.append(a)
    return out


def matmul_of(jobs):
    """The matmul-alone runs (`reel bench --matmul-only`): each report, or why it is missing."""
    out = []
    for j in (j for j in jobs if j["kind"] == "matmul"):
        data = load(j["file"]) if j["rc"] == "0" else None
        report = data or dict(error=error(j))
        report.update(variant=j["variant"], latent=j["shape"], notes=notes(j))
        out.append(report)
    return out


def matmul_lines(reports):
    lines = []
    med = lambda r: r["ms"]["median"] if r.get("ms") else None
    for rep in reports:
        lines += ["", f"Matrix products of a block alone ({rep['variant']}, latent {rep['latent']}, "
                  "`reel bench --matmul-only`; block ms: each product's median times its count "
                  "per block, for kernels that ran every product within the tolerance):"]
        if "error" in rep:
            lines.append(failed(rep["error"]))
            continue
        lines += ["", "| kernel | block ms | / burn |", "|---|---|---|"]
        lines += [f"| {s['kernel']} | {fmt(s['block_ms'], 3)} | {fmt(s['vs_burn'], 2)} |"
                  for s in rep["summary"]]
        per_layout = rep.get("best_pin")
        if per_layout:
            per_layout = (f" Best per layout: `{per_layout}` "
                          f"({fmt(rep.get('best_pin_block_ms'), 3)} ms per block).")
        lines += ["", f"Best over a block: `{rep['best']}`.{per_layout or ''} Per product, "
                  "Burn's matmul and the fastest correct kernel:", "",
                  "| product | [m, k, n] | per block | burn ms | TFLOP/s | fastest | ms | TFLOP/s |",
                  "|---|---|---|---|---|---|---|---|"]
        products = []
        for r in rep["rows"]:
            if r["product"]["name"] not in products:
                products.append(r["product"]["name"])
        for name in products:
            mine = [r for r in rep["rows"] if r["product"]["name"] == name]
            burn = next((r for r in mine if r["kernel"] == "burn"), {})
            ok = [r for r in mine if med(r) is not None and not r.get("error")]
            best = min(ok, key=med, default={})
            shape = mine[0]["product"]
            lines.append(f"| {name} | {shape['shape']} | {shape['per_block']} | "
                         f"{fmt(med(burn), 3)} | {fmt(burn.get('tflops'))} | "
                         f"{best.get('kernel', '—')} | {fmt(med(best) if best else None, 3)} | "
                         f"{fmt(best.get('tflops'))} |")
    return lines


DURATION = re.compile(r"^\| *([0-9.]+)(ns|µs|us|ms|s) *\| (.+)$")
UNIT_MS = {"ns": 1e-6, "µs": 1e-3, "us": 1e-3, "ms": 1.0, "s": 1e3}


def kernel_times(log):
    """Per kernel name (CubeCL's, runtime suffix dropped): launches and total ms of the later
    half of its launches in CubeCL's profiling log (`| 1.2ms | Name | CudaRuntime` per launch;
    the earlier half is the warm-up step's, compilation included)."""
    launches = {}
    for line in open(log, encoding="utf-8", errors="replace"):
        m = DURATION.match(line.strip())
        if m:
            name = re.sub(r" \| \w+Runtime$", "", m.group(3).strip())
            launches.setdefault(name, []).append(float(m.group(1)) * UNIT_MS[m.group(2)])
    kept = {n: d[len(d) - len(d) // 2:] for n, d in launches.items()}
    return sorted(((n, len(d), sum(d)) for n, d in kept.items() if d), key=lambda t: -t[2])


def kernels_of(jobs):
    """The profiled step's kernels, most time first: name, launches, ms, share."""
    out = []
    for j in (j for j in jobs if j["kind"] == "kernels"):
        if j["rc"] != "0":
            # A run stopped or failed part way leaves a partial log: the warm-up's launches
            # with their compilation, maybe part of the step. Its later half is not the
            # profiled step (on the H200, 2026-11-30, such a table showed a 4.3-s matmul), so
            # no table is made from it.
            err = error(j)
            if j["rc"] != "skipped" and os.path.exists(j.get("log", "")):
                err += ("; its partial profile holds the warm-up and the kernels' compilation, "
                        "not a profiled step: no kernel table")
            out.append(dict(what=profile_what(j), rc=j["rc"], error=err))
            continue
        try:
            times = kernel_times(j["log"])
        except Exception as e:
            out.append(dict(what=profile_what(j), rc=j["rc"], error=f"no profile log ({e})"))
            continue
        total = sum(ms for _, _, ms in times) or 1.0
        out.append(dict(what=profile_what(j), rc=j["rc"], total_ms=total,
                        kernels=[dict(name=n, launches=c, ms=ms, share=ms / total)
                                 for n, c, ms in times]))
    return out


def profile_what(j):
    """What a profile job ran: its `label`, or the training step's settings."""
    if "label" in j:
        return f"{j['label']}, {j['variant']}"
    ckpt = "checkpointing" if j.get("ckpt", "1") == "1" else "no checkpointing"
    return (f"one profiled step ({j['variant']}, {j['attention']}, latent {j.get('shape', '')}, "
            f"bf16, {ckpt})")


def memlogs_of(jobs):
    """CubeCL's memory pools in each `memlog` job (bench/gpu.sh's memlog_job): its pools' page
    sizes, how many pages the run made, and the pools' usage report when it made its last one
    (bytes in use then against bytes reserved)."""
    out = []
    for j in (j for j in jobs if j["kind"] == "memlog"):
        what = f"{j['variant']}, {j['attention']}, latent {j['shape']}, bf16, checkpointing"
        try:
            text = open(j["log"]).read()
        except Exception as e:
            out.append(dict(what=what, error=error(j) if j["rc"] != "0" else f"no log ({e})"))
            continue
        pools = sorted(set(re.findall(r"pool_type: (\w+ \{[^}]*\})", text)))
        pages = text.count("Allocated a new memory page")
        last = text.rfind("Allocated a new memory page")
        report = text.find("Memory Usage Report:", max(last, 0))
        usage = []
        if last >= 0 and report >= 0:
            usage = [l.strip() for l in text[report:].splitlines()[1:6] if l.strip()]
        out.append(dict(what=what, rc=j["rc"], pools=pools, pages=pages, last_page_usage=usage))
    return out


def memlog_lines(memlogs):
    lines = []
    for m in memlogs:
        lines += ["", f"CubeCL's memory pools ({m['what']}):"]
        if "error" in m:
            lines.append(failed(m["error"]))
            continue
        lines += ["", f"- {m['pages']} pages made; at the last one: " +
                  ("; ".join(m["last_page_usage"]) or "no usage report in the log")]
        lines += [f"- pool `{p}`" for p in m["pools"]]
    return lines


def kernel_lines(profiles, top=15):
    lines = []
    for p in profiles:
        lines += ["", f"Kernels of {p['what']}; each launch timed alone:"]
        if "error" in p:
            lines.append(failed(p["error"]))
            continue
        lines += ["", "| kernel | launches | ms | share |", "|---|---|---|---|"]
        for k in p["kernels"][:top]:
            name = k["name"].replace("|", "/")
            lines.append(f"| {name} | {k['launches']} | {k['ms']:.1f} | {100 * k['share']:.1f} % |")
        rest = p["kernels"][top:]
        if rest:
            ms = sum(k["ms"] for k in rest)
            lines.append(f"| {len(rest)} others | {sum(k['launches'] for k in rest)} | {ms:.1f} | "
                         f"{100 * ms / p['total_ms']:.1f} % |")
        lines.append(f"| total | | {p['total_ms']:.1f} | |")
    return lines


def failed(err):
    return err if err.startswith(("skipped", "stopped")) else "failed: " + err


def fmt(v, p=1):
    return "—" if v is None else f"{v:.{p}f}"


def attention_lines(attention):
    lines = ["", "Self-attention alone (q, k, v bf16; forward FLOPs 4·B·heads·N²·d, "
             "forward + backward 3.5×; max error: output and gradients against float32 "
             "memory_efficient, relative to their largest magnitude):", "",
             "| latent | kernel | [B, heads, N, d] | forward ms | TFLOP/s | fwd+bwd ms | TFLOP/s "
             "| max error |",
             "|---|---|---|---|---|---|---|---|"]
    med = lambda s: s["median"] if s else None
    for a in attention:
        if a.get("error") and not a.get("forward_ms"):
            lines.append(f"| {a['latent']} | {a['kernel']} | {a.get('shape', '')} | "
                         f"{failed(a['error'][:80])} | | | | |")
            continue
        err = a.get("max_error")
        err = "—" if err is None else f"{err:.1e}"
        if a.get("error"):
            err += f" ({a['error'][:60]})"
        lines.append(f"| {a['latent']} | {a['kernel']} | {a['shape']} | "
                     f"{fmt(med(a.get('forward_ms')), 2)} | {fmt(a.get('forward_tflops'))} | "
                     f"{fmt(med(a.get('train_ms')), 2)} | {fmt(a.get('train_tflops'))} | {err} |")
    return lines


def describe(job):
    """A job as `kind=... key=value...`: its kind and settings, without its results."""
    return " ".join(f"{k}={v}" for k, v in job.items() if k not in ("file", "rc", "mem", "secs"))


STEP_LINE = re.compile(r"^bench: .*: step \d+/\d+ \(([^)]*)\) ([0-9.]+) ms$")
SETUP_LINE = re.compile(r"^bench: .*, setup: inputs and random weights on the device in ([0-9.]+) s$")


def setup_seconds(job):
    """Seconds a `reel bench` run spent making its inputs and random weights (its stderr line);
    None for runs that print none."""
    found = [float(m.group(1)) for m in map(SETUP_LINE.match, err_lines(job)) if m]
    return round(sum(found), 1) if found else None


def step_seconds(job):
    """(warm-up, timed) seconds of the steps a `reel bench` run printed on stderr; (None, None)
    for runs that print none (PyTorch's)."""
    steps = [m.groups() for m in map(STEP_LINE.match, err_lines(job)) if m]
    if not steps:
        return None, None
    total = lambda warm: round(sum(float(ms) for k, ms in steps if (k == "warm-up") == warm) / 1e3, 1)
    return total(True), total(False)


def timeline_of(jobs):
    """Each job that ran: what it was, its exit status, its wall seconds and, for Reel's runs,
    the seconds of its warm-up and timed steps (the warm-up steps compile the kernels the
    kernel cache does not hold; the rest of the wall time is the process's start, the random
    weights and the device's start)."""
    out = []
    for j in (j for j in jobs if j["rc"] != "skipped"):
        warmup_s, timed_s = step_seconds(j)
        out.append(dict(run=describe(j), rc=j["rc"], secs=int(j["secs"]) if j.get("secs") else None,
                        warmup_s=warmup_s, timed_s=timed_s, setup_s=setup_seconds(j)))
    return out


def timeline_lines(timeline):
    if not timeline:
        return []
    lines = ["", "Wall time of each run (s; the machine's start and the transfers not counted; "
             "Reel's warm-up steps hold the kernels' compilation, its setup the inputs and random "
             "weights, the rest is the process's start and end):", "",
             "| run | exit | s | setup s | warm-up steps s | timed steps s | rest s |",
             "|---|---|---|---|---|---|---|"]
    for t in timeline:
        warm, timed, setup = t.get("warmup_s"), t.get("timed_s"), t.get("setup_s")
        rest = (t["secs"] - warm - timed - (setup or 0) if t["secs"] is not None
                and warm is not None and timed is not None else None)
        lines.append(f"| {t['run']} | {t['rc']} | {fmt(t['secs'], 0)} | {fmt(setup)} | "
                     f"{fmt(warm)} | {fmt(timed)} | {fmt(rest)} |")
    return lines


def markdown(gpu, date, rows, breakdowns, encoders, skipped, attention=(), profiles=(),
             matmul=(), timeline=()):
    lines = [f"{gpu}, {date}: medians of the timed steps, batch 1", "",
             "| tokens | variant | attention | dtype | ckpt | Reel step ms | PyTorch step ms | "
             "Reel / PyTorch | Reel fwd ms | PyTorch fwd ms | Reel GPU MiB | PyTorch GPU MiB |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        tokens = r["tokens"] or "x".join(map(str, r["shape"]))
        step = failed(r["error"][:60]) if r.get("error") else fmt(r["reel_step_ms"])
        lines.append(f"| {tokens} | {r['variant']} | {r['attention']} | {r['dtype']} | "
                     f"{'yes' if r['gradient_checkpointing'] else 'no'} | {step} | "
                     f"{fmt(r['torch_step_ms'])} | {fmt(r['ratio'], 2)} | "
                     f"{fmt(r['reel_forward_ms'])} | {fmt(r['torch_forward_ms'])} | "
                     f"{fmt(r['reel_gpu_mib'], 0)} | {fmt(r['torch_gpu_mib'], 0)} |")
    if attention:
        lines += attention_lines(attention)
    lines += matmul_lines(matmul)
    lines += kernel_lines(profiles)
    for b in breakdowns:
        what = (f"{b['method']} as shipped ({b['variant']}; random weights and data of its "
                f"shapes, attention {b.get('attention', 'flash')})" if b["method"].endswith(".toml")
                else f"{b['method']} ({b['variant']}, bf16, "
                     f"{'no checkpointing' if 'nockpt' in b['method'] else 'checkpointing'}"
                     f"{', %s tokens' % b['tokens'] if 'tokens' in b else ''})")
        floor = (f" (the roles' floor: {fmt(b['floor_mib'], 0)} MiB)" if "floor_mib" in b
                 else "")
        lines += ["", f"Breakdown, {what}, GPU peak {fmt(b.get('gpu_mib'), 0)} MiB{floor}:"]
        if "error" in b:
            lines.append(failed(b["error"]))
            continue
        ms = lambda s: f"{s.get('mean', s['median']):.1f} | {s['median']:.1f}"
        # host: until the phase's code returned, before its closing sync (near the phase's
        # time: the GPU kept up with the host; well below: the GPU set the pace).
        host = lambda p: f"{p['host_ms']['median']:.1f}" if "host_ms" in p else "—"
        lines += ["", "| phase | mean ms | median ms | share | host median ms |",
                  "|---|---|---|---|---|"]
        lines += [f"| {p['phase']} | {ms(p['ms'])} | {100 * p['share']:.1f} % | {host(p)} |"
                  for p in b["phases"]]
        lines.append(f"| step, profiled | {ms(b['profiled_step_ms'])} | | |")
        lines.append(f"| step, unprofiled | {ms(b['step_ms'])} | | |")
    if encoders:
        lines += ["", "| encoder run | | op | input | output | median ms | Reel / PyTorch "
                  "| GPU MiB (process peak) | kernels |", "|---|---|---|---|---|---|---|---|---|"]
        for e in encoders:
            if "error" in e:
                lines.append(f"| `{e['args']}` | {e['impl']} | {failed(e['error'][:80])} "
                             "| | | | | | |")
            else:
                torch_ms = e.get("torch_ms")
                ratio = f"{e['ms']['median'] / torch_ms:.2f}" if torch_ms else "—"
                lines.append(f"| `{e['args']}` | {e['impl']} | {e['op']} | {e['input']} | "
                             f"{e['output']} | {e['ms']['median']:.1f} | {ratio} | "
                             f"{fmt(e.get('gpu_mib'), 0)} | {e.get('kernels', '')} |")
    all_notes = sorted({n for group in (rows, breakdowns, encoders, attention, matmul)
                        for x in group for n in x.get("notes", [])})
    if all_notes:
        lines += ["", "Notes from Reel's runs:", ""] + [f"- `{n}`" for n in all_notes]
    if skipped:
        lines += ["", "Skipped (time budget, unless a reason is given): " + "; ".join(skipped)]
    lines += timeline_lines(timeline)
    return "\n".join(lines) + "\n"


def main():
    manifest, out, gpu, date, plan, budget = sys.argv[1:7]
    commit = sys.argv[7] if len(sys.argv) > 7 else None
    jobs = [json.loads(l) for l in open(manifest) if l.strip()]
    rows, breakdowns, encoders = rows_of(jobs, gpu, date), breakdowns_of(jobs), encoders_of(jobs)
    attention, profiles, matmul = attention_of(jobs), kernels_of(jobs), matmul_of(jobs)
    memlogs = memlogs_of(jobs)
    skipped = [describe(j) for j in jobs if j["rc"] == "skipped"]
    timeline = timeline_of(jobs)
    # Where the runs kept their compiled kernels (bench/gpu.sh; "off": every run compiled its own).
    kernel_cache = os.environ.get("REEL_KERNEL_CACHE") or None
    json.dump(dict(device=gpu, date=date, commit=commit, plan=plan, kernel_cache=kernel_cache,
                   budget_s=int(budget) if budget else None,
                   rows=rows, attention=attention, matmul=matmul, kernels=profiles,
                   breakdowns=breakdowns, memory_pools=memlogs,
                   encoders=encoders, skipped=skipped, timeline=timeline),
              open(out + ".json", "w"), indent=1)
    md = markdown(gpu, date, rows, breakdowns, encoders, skipped, attention, profiles, matmul,
                  timeline)
    if memlogs:
        md += "\n".join(memlog_lines(memlogs)) + "\n"
    if kernel_cache:
        md = f"Kernel cache (`REEL_KERNEL_CACHE`): `{kernel_cache}`.\n\n" + md
    if commit:
        md = f"Binaries built from commit `{commit}`.\n\n" + md
    open(out + ".md", "w").write(md)
    print(md)


if __name__ == "__main__":
    main()
