"""Bytes per point of candidate chunk codecs beside Prometheus' TSDB on the same samples (issue 36).

Measurement only. Workload (seeded): indicators x layers x steps of one run (default 8 x 64 x 2,000
= 1,024,000 samples), each series a mean-reverting log random walk, values exp(walk); the first half
of the indicators float32-valued doubles, the rest full float64; one series carries NaN and +-Inf.
Each series is cut into chunks of N points (the last one shorter); values (f64) and steps (i64) of a
chunk are encoded separately by: raw bytes (today); zstd on the raw bytes, without and with a byte
shuffle; Gorilla (Prometheus' XOR floats + delta-of-delta times, pure Python here); pcodec
(standalone format; ModeSpec.classic() for steps). Every chunk is decoded and compared bit for bit;
a mismatch stops the run. ``--row-header`` bytes per chunk (a stored row's header and key, 40 by
default, an approximation) are added to every codec's total. The same samples go through
``promtool tsdb create-blocks-from openmetrics`` (one sample per second per series, one block) and
its chunks, and chunks+index, are divided by the sample count. Results: bench/README_storage.md.

    .venv/bin/python bench/storage_codecs.py               # about 25 s on one core
    .venv/bin/python bench/storage_codecs.py --every 10 --gorilla-series 128
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pcodec
import zstandard
from pcodec import ChunkConfig, ModeSpec
from pcodec import standalone as pco

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gorilla import gorilla_steps_dec, gorilla_steps_enc, gorilla_values_dec, gorilla_values_enc

INDICATORS = ("attention_z", "router_z", "attention_rms", "mlp_rms", "lse_max", "output_z", "outliers", "maxvio")
TSDB_BASE = 1_700_006_400  # a 2-hour boundary, so all samples land in one block


# ---------------------------------------------------------------- workload
def _series(metric: str, labels: dict, kind: str, steps: np.ndarray, values: np.ndarray) -> dict:
    return {"metric": metric, "labels": labels, "kind": kind, "steps": steps, "values": values}


def synthetic(seed: int, n_ind: int, n_layers: int, n_steps: int, every: int, theta: float, sigma: float) -> list[dict]:
    rng = np.random.default_rng(seed)
    steps = np.arange(n_steps, dtype=np.int64) * every
    out: list[dict] = []
    for i in range(n_ind):
        f32 = i < n_ind // 2
        for layer in range(n_layers):
            mu = rng.normal(0.0, 1.5)
            eps = rng.normal(0.0, sigma, n_steps)
            walk = np.empty(n_steps)
            x = mu + rng.normal(0.0, 0.5)
            for t in range(n_steps):  # Ornstein-Uhlenbeck in log space
                x += theta * (mu - x) + eps[t]
                walk[t] = x
            v = np.exp(walk)
            if f32:
                v = v.astype(np.float32).astype(np.float64)
            kind = "f32" if f32 else "f64"
            out.append(_series("hw_" + INDICATORS[i % len(INDICATORS)], {"layer": str(layer)}, kind, steps, v))
    special = out[0]["values"]  # a float32-valued series, the harder case for float-quant modes
    q = n_steps // 7
    special[[q, 2 * q, 3 * q, 3 * q + 1]] = [np.nan, np.inf, -np.inf, np.nan]
    return out


def fixture(folder: Path) -> list[dict]:
    """Series the hooks sent in the runs recorded in ``folder`` (ew_record.py, ``<run>.json.gz``)."""
    runs = []
    for path in sorted(folder.glob("*.json.gz")):
        with gzip.open(path) as f:
            runs.append(json.loads(f.read()))
    return hooks_series(runs)


def hooks_series(runs: list[dict]) -> list[dict]:
    """Series the hooks sent in runs as ew_record.py records them (``name``, ``batches`` of [name, layer,
    step, value] rows; non-finite values as "NaN", "Infinity", "-Infinity")."""
    conv = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
    series: dict[tuple, dict] = {}
    for run in runs:
        for batch in run["batches"]:
            for name, layer, step, value in batch:
                key = (run["name"], name, layer)
                s = series.setdefault(key, {"steps": [], "values": []})
                s["steps"].append(step)
                s["values"].append(conv.get(value, value) if isinstance(value, str) else value)
    out = []
    for (run, name, layer), s in sorted(series.items()):
        order = np.argsort(np.asarray(s["steps"]), kind="stable")
        v = np.asarray(s["values"], np.float64)[order]
        f32 = np.array_equal(v.astype(np.float32).astype(np.float64).view(np.uint64), v.view(np.uint64))
        metric, kind = "hw_" + re.sub(r"[^A-Za-z0-9_]", "_", name), "f32" if f32 else "f64"
        out.append(_series(metric, {"run": run, "layer": str(layer)}, kind, np.asarray(s["steps"], np.int64)[order], v))
    return out


# ---------------------------------------------------------------- gorilla (Prometheus XOR chunk)
def shuffle(b: bytes) -> bytes:
    return np.frombuffer(b, np.uint8).reshape(-1, 8).T.tobytes()


def unshuffle(b: bytes) -> bytes:
    return np.frombuffer(b, np.uint8).reshape(8, -1).T.tobytes()


def make_codecs(zstd_levels: list[int]) -> dict:
    """name -> (values enc, values dec, steps enc, steps dec); dec(blob, n) -> array."""

    def f64(b: bytes, n: int) -> np.ndarray:
        return np.frombuffer(b, np.float64)

    def i64(b: bytes, n: int) -> np.ndarray:
        return np.frombuffer(b, np.int64)

    codecs: dict[str, tuple] = {"raw": (lambda a: a.tobytes(), f64, lambda a: a.tobytes(), i64)}
    dz = zstandard.ZstdDecompressor()
    for lvl in zstd_levels:
        cz = zstandard.ZstdCompressor(level=lvl)

        def plain(a: np.ndarray, c: zstandard.ZstdCompressor = cz) -> bytes:
            return c.compress(a.tobytes())

        def shuf(a: np.ndarray, c: zstandard.ZstdCompressor = cz) -> bytes:
            return c.compress(shuffle(a.tobytes()))

        codecs[f"zstd-{lvl}"] = (
            plain,
            lambda b, n: f64(dz.decompress(b), n),
            plain,
            lambda b, n: i64(dz.decompress(b), n),
        )
        codecs[f"zstd-{lvl}+shuf"] = (
            shuf,
            lambda b, n: f64(unshuffle(dz.decompress(b)), n),
            shuf,
            lambda b, n: i64(unshuffle(dz.decompress(b)), n),
        )
    codecs["gorilla"] = (gorilla_values_enc, gorilla_values_dec, gorilla_steps_enc, gorilla_steps_dec)
    vcfg, scfg = ChunkConfig(), ChunkConfig(mode_spec=ModeSpec.classic())
    codecs["pcodec"] = (
        lambda a: pco.simple_compress(a, vcfg),
        lambda b, n: pco.simple_decompress(b),
        lambda a: pco.simple_compress(a, scfg),
        lambda b, n: pco.simple_decompress(b),
    )
    return codecs


def measure(series: list[dict], name: str, codec: tuple, n_chunk: int) -> dict:
    venc, vdec, senc, sdec = codec
    chunks = [
        (s, lo, s["values"][lo : lo + n_chunk], s["steps"][lo : lo + n_chunk])
        for s in series
        for lo in range(0, len(s["values"]), n_chunk)
    ]
    t0 = time.perf_counter()
    blobs = [(venc(v), senc(st)) for _, _, v, st in chunks]
    t1 = time.perf_counter()
    back = [(vdec(vb, len(v)), sdec(sb, len(v))) for (vb, sb), (_, _, v, _) in zip(blobs, chunks)]
    t2 = time.perf_counter()
    vbytes: dict[str, int] = {}
    npts: dict[str, int] = {}
    for (s, lo, v, st), (vb, _), (v2, st2) in zip(chunks, blobs, back):
        if not (
            v2 is not None
            and v2.dtype == np.float64
            and v2.shape == v.shape
            and np.array_equal(v.view(np.uint64), v2.view(np.uint64))
        ):
            sys.exit(f"LOSSY: {name} N={n_chunk} values of {s['metric']}{s['labels']} from {lo}")
        if not (st2 is not None and st2.dtype == np.int64 and np.array_equal(st, st2)):
            sys.exit(f"LOSSY: {name} N={n_chunk} steps of {s['metric']}{s['labels']} from {lo}")
        vbytes[s["kind"]] = vbytes.get(s["kind"], 0) + len(vb)
        npts[s["kind"]] = npts.get(s["kind"], 0) + len(v)
    n = sum(npts.values())
    return {
        "codec": name,
        "n_chunk": n_chunk,
        "points": n,
        "chunks": len(chunks),
        "values": sum(vbytes.values()) / n,
        "steps": sum(len(sb) for _, sb in blobs) / n,
        "by_kind": {k: vbytes[k] / npts[k] for k in vbytes},
        "enc_s_per_M": (t1 - t0) / n * 1e6,
        "dec_s_per_M": (t2 - t1) / n * 1e6,
    }


# ---------------------------------------------------------------- Prometheus TSDB
def om_value(x: float) -> str:
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    return repr(x)  # shortest repr that parses back to the same double


def tsdb(series: list[dict], promtool: str, work: Path) -> dict:
    lines = []
    by_metric: dict[str, list[dict]] = {}
    for s in series:
        by_metric.setdefault(s["metric"], []).append(s)
    for metric, group in sorted(by_metric.items()):
        lines.append(f"# TYPE {metric} gauge")
        for s in group:
            lab = ",".join(f'{k}="{v}"' for k, v in s["labels"].items())
            for i, v in enumerate(s["values"].tolist()):  # one sample per second, in step order
                lines.append(f"{metric}{{{lab}}} {om_value(v)} {TSDB_BASE + i}")
    lines.append("# EOF\n")
    om, out = work / "samples.om", work / "blocks"
    om.write_text("\n".join(lines))
    t0 = time.perf_counter()
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", "--quiet", str(om), str(out)], check=True)
    seconds = time.perf_counter() - t0
    blocks = [p for p in out.iterdir() if p.is_dir()]
    chunk_bytes = sum(f.stat().st_size for b in blocks for f in (b / "chunks").iterdir())
    index_bytes = sum((b / "index").stat().st_size for b in blocks)
    all_bytes = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    n = sum(len(s["values"]) for s in series)
    meta = [json.loads((b / "meta.json").read_text()) for b in blocks]
    got = sum(m["stats"]["numSamples"] for m in meta)
    if got != n:
        sys.exit(f"TSDB holds {got} samples, expected {n}")
    return {
        "samples": n,
        "blocks": len(blocks),
        "chunks": chunk_bytes / n,
        "chunks_index": (chunk_bytes + index_bytes) / n,
        "block_dir": all_bytes / n,
        "tsdb_chunks": sum(m["stats"]["numChunks"] for m in meta),
        "seconds": seconds,
    }


# ---------------------------------------------------------------- report
def run_set(title: str, series: list[dict], args: argparse.Namespace, codecs: dict) -> list[dict]:
    n = sum(len(s["values"]) for s in series)
    print(f"\n## {title}: {len(series)} series, {n:,} points", flush=True)
    ref = None
    if args.promtool:
        with tempfile.TemporaryDirectory(prefix="hw-tsdb-") as tmp:
            ref = tsdb(series, args.promtool, Path(tmp))
        print(
            f"TSDB: {ref['blocks']} block(s), {ref['tsdb_chunks']} chunks, promtool {ref['seconds']:.1f} s; "
            f"chunks {ref['chunks']:.3f} B/pt, chunks+index {ref['chunks_index']:.3f} B/pt, "
            f"whole block dir {ref['block_dir']:.3f} B/pt",
            flush=True,
        )
    rows = []
    for name, codec in codecs.items():
        subset = series
        if name == "gorilla" and 0 < args.gorilla_series < len(series):
            idx = np.unique(np.linspace(0, len(series) - 1, args.gorilla_series).round().astype(int))
            subset = [series[i] for i in idx]
        for n_chunk in args.chunks:
            r = measure(subset, name, codec, n_chunk)
            r["subset"] = f"{len(subset)}/{len(series)}" if subset is not series else ""
            r["total"] = r["values"] + r["steps"] + args.row_header * r["chunks"] / r["points"]
            rows.append(r)
            print(f"  {name:>13} N={n_chunk:<5} {r['total']:.3f} B/pt", flush=True)
    head = (
        f"| codec | N | values | steps | total (+{args.row_header} B/chunk) | vs TSDB c+i "
        "| vs TSDB chunks | enc s/Mpt | dec s/Mpt |"
    )
    print("\n" + head + "\n|" + "---|" * 9)
    if ref:
        print(
            f"| prometheus TSDB (chunks+index) | 120 | | | {ref['chunks_index']:.3f} | 1.00x | "
            f"{ref['chunks_index'] / ref['chunks']:.2f}x | | |"
        )
        print(
            f"| prometheus TSDB (chunks only) | 120 | | | {ref['chunks']:.3f} | "
            f"{ref['chunks'] / ref['chunks_index']:.2f}x | 1.00x | | |"
        )
    for r in rows:
        rc = f"{r['total'] / ref['chunks_index']:.2f}x" if ref else "-"
        rk = f"{r['total'] / ref['chunks']:.2f}x" if ref else "-"
        label = r["codec"] + (f" ({r['subset']} series)" if r["subset"] else "")
        print(
            f"| {label} | {r['n_chunk']} | {r['values']:.3f} | {r['steps']:.3f} | {r['total']:.3f} | "
            f"{rc} | {rk} | {r['enc_s_per_M']:.3f} | {r['dec_s_per_M']:.3f} |"
        )
    kinds = sorted(rows[0]["by_kind"])
    if len(kinds) > 1:
        print("\nvalues bytes/point by series kind (f32 = float32-valued doubles):\n")
        print("| codec | N | " + " | ".join(kinds) + " |\n|" + "---|" * (2 + len(kinds)))
        for r in rows:
            print(f"| {r['codec']} | {r['n_chunk']} | " + " | ".join(f"{r['by_kind'][k]:.3f}" for k in kinds) + " |")
    return [{"set": title, "tsdb": ref, **r} for r in rows]


def positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1: {v}")
    return v


def int_list(lo: int, hi: int):
    def parse(text: str) -> list[int]:
        try:
            vals = [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a comma-separated integer list: {text!r}") from None
        if not vals or any(not lo <= v <= hi for v in vals):
            raise argparse.ArgumentTypeError(f"each value must be in [{lo}, {hi}]: {text!r}")
        return sorted(set(vals))

    return parse


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--seed", type=int, default=36)
    p.add_argument("--indicators", type=positive, default=8, help="first half float32-valued")
    p.add_argument("--layers", type=positive, default=64)
    p.add_argument("--steps", type=positive, default=2000, help="points per series")
    p.add_argument("--every", type=positive, default=1, help="step stride (steps 0, every, ...)")
    p.add_argument("--theta", type=float, default=0.02, help="mean reversion per step (0..1)")
    p.add_argument("--sigma", type=float, default=0.02, help="log-space step noise (> 0)")
    p.add_argument(
        "--chunks", type=int_list(2, 1 << 20), default=[16, 256, 1024, 2048], help="chunk lengths, comma-separated"
    )
    p.add_argument("--zstd-levels", type=int_list(1, 22), default=[3])
    p.add_argument(
        "--gorilla-series", type=int, default=0, help="run Gorilla on this many evenly spread series (0: all)"
    )
    p.add_argument("--row-header", type=int, default=40, help="bytes added per stored chunk row")
    p.add_argument(
        "--promtool", default=shutil.which("promtool") or "", help="promtool binary ('' to skip the TSDB reference)"
    )
    p.add_argument(
        "--fixture",
        type=Path,
        default=None,
        help="folder of recorded real-hook runs (*.json.gz; default: the first "
        "tests/**/ewf_series holding some); '' to skip",
    )
    p.add_argument("--json", type=Path, help="also write all rows here")
    args = p.parse_args(argv)
    if not 0 < args.theta < 1:
        p.error("--theta must be in (0, 1)")
    if not (args.sigma > 0 and math.isfinite(args.sigma)):
        p.error("--sigma must be a finite number > 0")
    if args.gorilla_series < 0 or args.row_header < 0:
        p.error("--gorilla-series and --row-header must be >= 0")
    if args.steps < 8:
        p.error("--steps must be >= 8 (the NaN/Inf positions need room)")
    if args.promtool and not Path(args.promtool).is_file():
        p.error(f"promtool not found at {args.promtool!r} (apt-get install -y prometheus, or pass '')")
    if args.fixture is None:
        found = [d for d in sorted(Path("tests").rglob("ewf_series")) if any(d.glob("*.json.gz"))]
        fixture_dir = found[0] if found else None
    else:
        fixture_dir = args.fixture if str(args.fixture) not in ("", ".") else None
    if fixture_dir and not fixture_dir.is_dir():
        p.error(f"--fixture folder not found: {fixture_dir}")

    print(
        f"numpy {np.__version__}, zstandard {zstandard.__version__}, pcodec {pcodec.__version__}, "
        f"promtool {args.promtool or 'skipped'}"
    )
    codecs = make_codecs(args.zstd_levels)
    t0 = time.perf_counter()
    series = synthetic(args.seed, args.indicators, args.layers, args.steps, args.every, args.theta, args.sigma)
    print(f"workload generated in {time.perf_counter() - t0:.1f} s", flush=True)
    rows = run_set(f"synthetic (seed {args.seed}, every {args.every})", series, args, codecs)
    if fixture_dir:
        hook = fixture(fixture_dir)
        if hook:
            rows += run_set(f"real-hook fixture {fixture_dir}", hook, args, codecs)
        else:
            print(f"\nno recorded series under {fixture_dir}")
    else:
        print("\nno recorded real-hook series found (tests/**/ewf_series) or --fixture ''")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
