"""`kvloop control show|set`: read the control block, or write targets by hand."""

from __future__ import annotations

import argparse
import json

from kvloop.engine.control.block import DEFAULT_PATH, ControlBlockError
from kvloop.engine.control.link import SidecarLink
from kvloop.engine.core.knobs import KNOBS


def add_control_parser(sub) -> None:
    p = sub.add_parser("control", help="show or set the engine/sidecar control block")
    csub = p.add_subparsers(dest="control_command", required=True)
    show = csub.add_parser("show", help="print the engine's snapshot and the targets in the block")
    show.add_argument("--control", default=DEFAULT_PATH, help="control block file")
    show.add_argument("--json", action="store_true", help="one JSON object instead of text")
    show.set_defaults(func=cmd_show)
    st = csub.add_parser("set", help="write targets (as the sidecar would)")
    st.add_argument("--control", default=DEFAULT_PATH, help="control block file")
    for k in KNOBS:  # --batch-cap, also spelled as the knob is named (--batch_cap)
        spellings = dict.fromkeys(("--" + k.name.replace("_", "-"), "--" + k.name))  # one for --watermark
        st.add_argument(*spellings, dest=k.name, type=k.kind, default=None,
                        help=f"{k.doc} ({k.unit}; valid in {k.bounds()})")
    st.set_defaults(func=cmd_set)


def cmd_show(args: argparse.Namespace) -> int:
    try:
        link = SidecarLink(args.control)
    except ControlBlockError as exc:
        print(f"error: {exc}")
        return 1
    snap, targets = link.read_snapshot(), link.read_targets()
    out = {"snapshot": snap.as_dict() if snap else None,
           "targets": None if targets is None else {
               **targets.knob_values(), "version": targets.version,
               "age_s": round((link.clock() - targets.time_ns) / 1e9, 3), "writer_id": targets.writer_id}}
    if args.json:
        print(json.dumps(out))
        return 0
    for section, values in out.items():
        print(f"[{section}]" + ("" if values else " none"))
        for key, value in (values or {}).items():
            print(f"  {key:24} {value}")
    return 0


def cmd_set(args: argparse.Namespace) -> int:
    values = {k.name: getattr(args, k.name) for k in KNOBS}
    if all(v is None for v in values.values()):
        print("error: give " + " and/or ".join("--" + k.replace("_", "-") for k in values))
        return 2
    try:
        link = SidecarLink(args.control)
    except ControlBlockError as exc:
        print(f"error: {exc}")
        return 1
    t = link.write_targets(**values)
    print(f"wrote targets version {t.version}: " + " ".join(f"{k}={v}" for k, v in t.knob_values().items()))
    return 0
