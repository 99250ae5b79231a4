"""Run the benchmark suite and write bench/RESULTS.md (see bench/README.md).

.venv/bin/python bench/run.py            # full: N = 50, 200, 1000, both variants
.venv/bin/python bench/run.py --quick    # N = 50, 200, fewer repeats -> bench/out/RESULTS.quick.md
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import env, report  # noqa: E402
from bench.wl import check_table, source_info  # noqa: E402

FULL = {
    "sizes": (50, 200, 1000),
    # A full run takes a few minutes now: enough repeats for medians that hold still.
    "repeats": {50: 5, 200: 5, 1000: 5},
    "e2e_repeats": {50: 3, 200: 3, 1000: 3},
    "reads": 7,
    "tp_runs": 100,
    "tp_steps": 20,
}
QUICK = {
    "sizes": (50, 200),
    "repeats": {50: 2, 200: 1},
    "e2e_repeats": {50: 1, 200: 1},
    "reads": 3,
    "tp_runs": 100,
    "tp_steps": 10,
}


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="N = 50, 200 only, fewer repeats")
    p.add_argument("--variants", default="grow,flat", help="comma-separated (default: grow,flat)")
    p.add_argument("--sizes", default="", help="comma-separated N, overriding the mode's")
    p.add_argument("--no-celery", action="store_true", help="skip the worker cases")
    p.add_argument("--no-pages", action="store_true", help="skip bench/bench_pages.py")
    p.add_argument(
        "--budget",
        type=float,
        default=900.0,
        help="seconds allowed per repeat of a case before it is aborted (default 900)",
    )
    p.add_argument(
        "--out",
        default="",
        help="markdown file (default bench/RESULTS.md; --quick: bench/out/RESULTS.quick.md)",
    )
    p.add_argument(
        "--report-only", metavar="JSON", help="rewrite the markdown from a saved results file"
    )
    args = p.parse_args()

    mode = QUICK if args.quick else FULL
    out_md = (
        Path(args.out)
        if args.out
        else (env.OUT / "RESULTS.quick.md" if args.quick else env.ROOT / "bench" / "RESULTS.md")
    )
    if args.report_only:
        results = json.loads(Path(args.report_only).read_text())
        out_md.write_text(report.render(results))
        print(f"wrote {out_md}")
        return 0

    sizes = tuple(int(x) for x in args.sizes.split(",")) if args.sizes else mode["sizes"]
    variants = tuple(v for v in args.variants.split(",") if v)
    env.setup()
    check_table()
    results: dict[str, Any] = {
        "mode": "quick" if args.quick else "full",
        "command": " ".join([".venv/bin/python", "bench/run.py", *sys.argv[1:]]),
        "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": report.machine(),
        "versions": report.versions(),
        "postgres": env.server_settings(),
        "workload": source_info(),
        "code": {"in-process": report.code_version()},
        "in_process": [],
        "e2e": [],
        "throughput": [],
        "errors": [],
    }
    pg = results["postgres"]
    if pg["fsync"] != "on" or pg["synchronous_commit"] != "on":
        print(
            f"refusing to measure: fsync={pg['fsync']} synchronous_commit={pg['synchronous_commit']}"
        )
        return 2
    json_path = env.OUT / f"results-{results['mode']}.json"

    def save() -> None:
        results["finished"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        results["machine"]["loadavg_end"] = os.getloadavg()
        results["machine"]["cpu_share"] = report.cpu_share(
            results["machine"]["cpu_start"], report.cpu_times()
        )
        json_path.write_text(json.dumps(results, indent=1))
        out_md.write_text(report.render(results))

    from bench import celery_bench, measure

    # Cases take turns, one repeat each per round: a machine that slows down for a
    # while slows every case alike, so cases compare (flat N=1000 against N=50) fairly.
    cases = []
    for n in sizes:
        for variant in variants:
            case: dict[str, Any] = {"variant": variant, "n": n, "repeats": []}
            results["in_process"].append(case)
            cases.append(case)
    stopped: set[int] = set()
    run_no = 0
    for r in range(max(mode["repeats"].get(n, 1) for n in sizes)):
        for i, case in enumerate(cases):
            variant, n = case["variant"], case["n"]
            if i in stopped or r >= mode["repeats"].get(n, 1):
                continue
            run_no += 1
            t0 = time.monotonic()
            try:
                rep = measure.one_repeat(variant, n, run_no, mode["reads"], args.budget)
            except Exception as exc:  # recorded; the other cases still run
                traceback.print_exc()
                results["errors"].append(f"in-process {variant} N={n} #{r + 1}: {exc!r}")
                stopped.add(i)
                continue
            case["repeats"].append(rep)
            print(
                f"in-process {variant:4s} N={n:<5d} #{r + 1}: {report.brief(rep)} "
                f"({time.monotonic() - t0:.0f} s)",
                flush=True,
            )
            save()
            if "aborted" in rep:
                stopped.add(i)

    if not args.no_pages:
        results["code"]["pages"] = report.code_version()
        t0 = time.monotonic()
        try:
            results["pages"] = measure.pages(timeout_s=args.budget)
        except Exception as exc:
            traceback.print_exc()
            results["errors"].append(f"bench_pages.py: {exc!r}")
        else:
            detail = results["pages"].get("run_detail")
            print(
                f"pages (bench_pages.py): run detail {detail['median'] if detail else '?'} ms "
                f"({time.monotonic() - t0:.0f} s)",
                flush=True,
            )
            if results["pages"].get("error"):
                results["errors"].append("bench_pages.py: " + results["pages"]["error"][-300:])
        save()

    if not args.no_celery:
        results["code"]["celery"] = report.code_version()  # the workers load the code now
        celery_bench.reset_broker()
        try:
            with celery_bench.Workers(1):
                for n in sizes:
                    for variant in variants:
                        case = {"variant": variant, "n": n, "repeats": []}
                        results["e2e"].append(case)
                        for r in range(mode["e2e_repeats"].get(n, 1)):
                            t0 = time.monotonic()
                            try:
                                rep = celery_bench.e2e_repeat(variant, n, args.budget)
                            except Exception as exc:
                                traceback.print_exc()
                                results["errors"].append(f"e2e {variant} N={n} #{r + 1}: {exc!r}")
                                break
                            case["repeats"].append(rep)
                            print(
                                f"celery     {variant:4s} N={n:<5d} #{r + 1}: {report.brief_e2e(rep)} "
                                f"({time.monotonic() - t0:.0f} s)",
                                flush=True,
                            )
                            save()
                            if "aborted" in rep:
                                break
            for workers in (1, 2):
                celery_bench.reset_broker()
                try:
                    tp = celery_bench.throughput(
                        workers, mode["tp_runs"], mode["tp_steps"], args.budget
                    )
                except Exception as exc:
                    traceback.print_exc()
                    results["errors"].append(f"throughput {workers} worker(s): {exc!r}")
                    continue
                results["throughput"].append(tp)
                print(
                    f"throughput {workers} worker(s): {tp['steps_per_s']:.1f} steps/s "
                    f"({tp['steps']} steps in {tp['seconds']:.1f} s)",
                    flush=True,
                )
                save()
        finally:
            celery_bench.reset_broker()

    save()
    print(f"wrote {out_md} and {json_path}")
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
