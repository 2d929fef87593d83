"""``python -m standins.k8s_api``: serve the stand-in Kubernetes API from a process of its own until stdin closes.

With ``--synthetic PODS,EVENTS`` it plays a synthetic run group once a watch is open (the watcher
benchmark measures the client alone); ``--burst`` renders the events before serving, so they reach
the watch as one backlog (docs/internals/stand-ins.md, "The Kubernetes API stand-in").
"""

from __future__ import annotations

import argparse
import sys

from standins.k8s_api import KubeAPIStandIn, synthetic_run_group


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Serve a stand-in Kubernetes API on 127.0.0.1 until stdin closes.")
    parser.add_argument("--token", default="standin-token")
    parser.add_argument("--namespace", default="llmpack")
    parser.add_argument("--synthetic", metavar="PODS,EVENTS", help="play a synthetic run group once a watch is open")
    parser.add_argument("--run-group", default="bench")
    parser.add_argument("--watches", type=int, default=1, help="open watches to wait for before playing")
    parser.add_argument("--burst", action="store_true",
                        help="render the synthetic events before serving, log them at once when the watches are open")
    parser.add_argument("--pulls-in-stream", action="store_true",
                        help="the image-pull events come in the stream at their times, not stored before it")
    args = parser.parse_args(argv)
    api = KubeAPIStandIn(token=args.token, namespaces=("default", args.namespace)).start()
    if args.synthetic:
        n_pods, n_events = (int(x) for x in args.synthetic.split(","))
        nodes, pulls, stream = synthetic_run_group(n_pods, n_events, run_group=args.run_group, namespace=args.namespace,
                                                   pulls_in_stream=args.pulls_in_stream)
        for node in nodes:
            api.add_node(node)
        for event in pulls:
            api.add_event(event)
        api.play([api.burst(stream)] if args.burst else stream, wait_for_watches=args.watches, wait_timeout=60)
    print(api.url, flush=True)
    sys.stdin.read()
    api.close()
    return 0
