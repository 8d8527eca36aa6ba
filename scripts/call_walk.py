"""How far a reader must walk through the package to follow one job: files visited, cross-file stops.

    python scripts/call_walk.py load [NAME]          # cl_zoo.load_pretrained(NAME) -> torch module
    python scripts/call_walk.py embed FOLDER OUT     # cl-zoo embed FOLDER --out OUT, in-process

Traces the job with :func:`sys.setprofile` and keeps only frames in ``cl_zoo/``. A *stop* is a
move from one file to another: a *call* into a function of another file, or a *return* back to
one. Each distinct move (caller function -> callee function) is counted once, so loops over
images or batches do not inflate the numbers; what remains is what a reader follows. Lower is a
flatter path: fewer files to open, fewer trips back. Every module is imported before the trace
starts, so module bodies (registrations, constants) are not counted as stops.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from pathlib import Path



def trace(job) -> dict:  # noqa: ANN001 - a zero-argument callable
    import importlib
    import pkgutil

    import cl_zoo

    package = str(Path(cl_zoo.__file__).resolve().parent) + os.sep  # the copy that runs, wherever it is
    # Import every module first: the walk is the job's calls, not the import machinery's module code.
    for info in pkgutil.walk_packages(cl_zoo.__path__, "cl_zoo."):
        if info.name.endswith("__main__"):
            continue
        try:
            importlib.import_module(info.name)
        except Exception:  # noqa: BLE001 - an optional dependency missing here; the job imports what it needs
            pass
    moves: list[tuple[str, str, str]] = []
    seen: set[tuple[str, str, str, str]] = set()
    files: list[str] = []
    stack: list[tuple[str, str]] = []  # (file, function) of the cl_zoo frames entered

    def short(path: str) -> str:
        return "cl_zoo/" + path[len(package) :]

    def profile(frame, event, arg):  # noqa: ANN001, ANN202
        if event not in ("call", "return"):
            return
        path = frame.f_code.co_filename
        if not path.startswith(package):
            return
        here = (short(path), frame.f_code.co_qualname)
        if event == "call":
            if stack and stack[-1][0] != here[0]:
                key = ("call", stack[-1][1], here[0], here[1])
                if key not in seen:
                    seen.add(key)
                    moves.append(("call", stack[-1][0], here[0]))
            if here[0] not in files:
                files.append(here[0])
            stack.append(here)
        else:
            if stack and stack[-1] == here:
                stack.pop()
                if stack and stack[-1][0] != here[0]:
                    key = ("return", here[1], stack[-1][0], stack[-1][1])
                    if key not in seen:
                        seen.add(key)
                        moves.append(("return", here[0], stack[-1][0]))

    sys.setprofile(profile)
    try:
        job()
    finally:
        sys.setprofile(None)
    calls = sum(1 for m in moves if m[0] == "call")
    return {"files": files, "stops": len(moves), "calls": calls, "returns": len(moves) - calls}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("walk", choices=["load", "embed"])
    parser.add_argument("args", nargs="*")
    args = parser.parse_args()
    if args.walk == "load":
        import cl_zoo

        name = args.args[0] if args.args else "cacr_resnet18.imagenette64_cpu"
        report = trace(lambda: cl_zoo.load_pretrained(name))
    else:
        from cl_zoo.cli import main as cli_main

        folder, out = args.args
        report = trace(lambda: cli_main(["embed", folder, "--out", out, "-q", "--workers", "0", "--force"]))
    print(f"{args.walk}: {report['stops']} stops ({report['calls']} calls, {report['returns']} returns) in {len(report['files'])} files")
    print("files: " + ", ".join(report["files"]))
    return 0


if __name__ == "__main__":
    threading.setprofile(None)
    sys.exit(main())
