"""What gpu-placement costs kube-scheduler and the API server, side by side on a real control plane.

Starts the e2e control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler v1.37,
built once by tests/e2e/build_control_plane.sh) with the chart installed and its processes running,
makes --nodes verified 8-GPU nodes kept alive without kubelets, then prints two tables from one run
(tests/e2e/overhead.py says exactly what each measures):

- scheduling: the same one-GPU pods, created before each scheduler starts, scheduled in rotating
  batches by kube-scheduler's default profile and configuration (stock: the adaptive
  percentageOfNodesToScore, issue 44's baseline), by the chart's configuration without the extender
  (stock-chart, the same-configuration line) and by the gpu-placement profile: pods/s, kube-scheduler's
  own cycle latency (mean, p50, p99), the ratios, the CPU each process spent per pod,
  scheduler_batch_attempts_total (no profile batches: stock's PodTopologySpread System defaulting is
  pinned), and /bind in the extender next to the Binding POST in the API server;
- admission (unless --no-admission): the same creates with no webhook, a do-nothing webhook on the
  same stack, and gpu-placement's: creates/s and create latency p50/p99. --admission-rounds rounds of
  --creates each (default 8 of 200): the do-nothing webhook and gpu-placement back to back in every
  round, so the table also gives the median of the rounds' ratios, which the machine's drifting load
  moves less than the ratio of the totals (3 rounds of 300 swung from 0.92x to 1.64x on a 2-vCPU VM).

    .venv/bin/python benchmarks/scheduler_bench.py [--nodes 1000] [--rounds 3] [--pods 300]
        [--qps 1000] [--default-qps-rounds 0] [--admission-rounds 8] [--creates 200] [--no-admission]
        [--lease-renew-seconds S] [--profiles DIR] [--strategy fragmentation|binpack|spread] [--tier-size K]
        [--percentage P]

Both schedulers' clients run at --qps (burst twice that), far above what either sends here, so
neither is held by its rate limiter (the table prints its waits); --default-qps-rounds adds a line at
kube-scheduler's default QPS (50), as the chart runs it. --profiles DIR writes each batch's CPU
profiles: kube-scheduler's (pprof, `go tool pprof -top DIR/NN-gpu-placement.scheduler.pprof`) and
the extender's (py-spy's raw collapsed stacks; py-spy must be installed in the venv). --strategy sets
the chart's `config.scoring.strategy` (default: the chart's, fragmentation): how many nodes a `/prioritize`
answer lists during a burst depends on it (docs/performance.md, "What the answers' size costs").

At 5,000 nodes the emulated kubelets renew each node's Lease every 60 s (default from 2,000 nodes on;
kube-controller-manager's grace period here is 120 s), so that 5,000 Leases cost about 80 writes/s
rather than 500. Run it alone (`flock /tmp/e2e.lock ...` on a shared machine): it takes the machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.e2e.cluster import start_control_plane
from tests.e2e.conftest import chart_running
from tests.e2e.overhead import (
    admission_side_by_side,
    admission_table,
    load,
    make_nodes,
    scheduling_line,
    scheduling_side_by_side,
    scheduling_table,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3, help="alternating scheduling rounds (default 3)")
    parser.add_argument("--pods", type=int, default=300, help="pods per scheduling batch (default 300)")
    parser.add_argument("--qps", type=int, default=1000, help="both schedulers' client QPS (default 1000)")
    parser.add_argument("--default-qps-rounds", type=int, default=0,
                        help="rounds more at kube-scheduler's default client QPS (default 0)")
    parser.add_argument("--profiles", type=Path, default=None, help="write each batch's CPU profiles here")
    parser.add_argument("--admission-rounds", type=int, default=8,
                        help="admission rounds, each the three cases (default 8)")
    parser.add_argument("--creates", type=int, default=200, help="creates per admission round and case (default 200)")
    parser.add_argument("--no-admission", action="store_true", help="skip the admission side by side")
    parser.add_argument("--strategy", choices=("fragmentation", "binpack", "spread"), default=None,
                        help="the chart's config.scoring.strategy (default: the chart's own)")
    parser.add_argument("--tier-size", type=int, default=None,
                        help="the chart's config.scoring.tierSize (default: the chart's own; 0: /prioritize too)")
    parser.add_argument("--percentage", type=int, default=None,
                        help="the chart's scheduler.percentageOfNodesToScore (default: the chart's own; 0: adaptive)")
    parser.add_argument("--lease-renew-seconds", type=float, default=None,
                        help="how often each node's Lease is renewed (default 10 s; 60 s from 2,000 nodes)")
    args = parser.parse_args(argv)
    renew = args.lease_renew_seconds or (60.0 if args.nodes >= 2000 else 10.0)
    started = time.monotonic()
    scoring = {**({"strategy": args.strategy} if args.strategy else {}),
               **({"tierSize": args.tier_size} if args.tier_size is not None else {})}
    values: dict[str, Any] = {"config": {"scoring": scoring}} if scoring else {}
    if args.percentage is not None:
        values["scheduler"] = {"percentageOfNodesToScore": args.percentage}
    print(f"scheduler_bench: {args.nodes} nodes, Leases renewed every {renew:g} s, scoring strategy "
          f"{args.strategy or 'the chart default'}, tier size "
          f"{'the chart default' if args.tier_size is None else args.tier_size}, percentageOfNodesToScore "
          f"{'the chart default' if args.percentage is None else args.percentage}; {load()}", flush=True)
    plane = start_control_plane()
    try:
        with chart_running(plane, lease_renew_seconds=renew, values=values or None) as e2e:
            t0 = time.monotonic()
            make_nodes(e2e, "bench", args.nodes, timeout=max(300, args.nodes * 0.3))
            print(f"{args.nodes} nodes made and schedulable in {time.monotonic() - t0:.0f} s; {load()}", flush=True)
            batches = scheduling_side_by_side(e2e, "bench", args.rounds, args.pods, qps=args.qps,
                                              profiles=args.profiles)
            print(scheduling_table(batches, args.nodes), flush=True)
            if args.default_qps_rounds:
                default = scheduling_side_by_side(e2e, "bench", args.default_qps_rounds, args.pods)
                print("second line, " + scheduling_line(default), flush=True)
            if not args.no_admission:
                print(admission_table(admission_side_by_side(e2e, args.admission_rounds, args.creates)), flush=True)
    finally:
        plane.stop()
    print(f"total {time.monotonic() - started:.0f} s (machine: {os.cpu_count()} CPUs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
