"""The `flashlib` command: `flashlib check ex01`, `flashlib check --all`, `flashlib grade DIR`.

One argparse parser with one subcommand per verb; each subcommand's function takes the parsed
arguments and returns the exit code. To add a verb (e.g. `bench`), add a ``_add_<verb>`` that
registers its subparser with ``set_defaults(run=...)`` and call it in ``build_parser``.
"""
import argparse
import sys


def _run_check(args) -> int:
    from . import self_check

    if args.all == (args.exercise is not None):
        print("give one exercise (flashlib check ex01) or --all", file=sys.stderr)
        return 2
    if args.all:
        ok = self_check.check_all(impl=args.impl, path=args.path, seed=args.seed)
    else:
        ok = self_check.check(args.exercise, impl=args.impl, path=args.path, seed=args.seed)
    return 0 if ok else 1


def _add_check(sub):
    p = sub.add_parser("check", help="grade your exercise(s) and print hints",
                       description="Grade one exercise (or all) and print a report with hints. "
                                   "Exit code 0 if every check passes, 1 if not.")
    p.add_argument("exercise", nargs="?", help='e.g. "ex01", "1" or "ex01_safe_softmax"')
    p.add_argument("--all", action="store_true", help="grade every exercise")
    p.add_argument("--impl", default="exercises", choices=["exercises", "solutions"],
                   help="grade your work in exercises/ (default) or the reference solutions/")
    p.add_argument("--path", help="grade this file (or folder of exNN_*.py files) instead")
    p.add_argument("--seed", type=int, help="inputs' random seed (default: fresh, or "
                                            "$FLASHLIB_SEED)")
    p.set_defaults(run=_run_check)


def _run_grade(args) -> int:
    from . import classroom

    try:
        classroom.grade(args.submissions, out=args.out, timeout=args.timeout, jobs=args.jobs,
                        exercises=args.exercises, seed=args.seed, memory=args.memory,
                        unconfined=args.unconfined)
    except (FileNotFoundError, LookupError, ValueError, classroom.Unconfined) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def _add_grade(sub):
    p = sub.add_parser("grade", help="instructors: grade a folder of student submissions",
                       description="Grade SUBMISSIONS/<student>/exNN_*.py for every student and "
                                   "exercise: each file runs in its own process under bubblewrap "
                                   "(a fresh read-only view as nobody; time, memory and output "
                                   "limits), the checks run in the grader's process. "
                                   "Write a CSV and print a table.")
    p.add_argument("submissions", help="folder with one folder per student (a copy of exercises/)")
    p.add_argument("--out", default="grades.csv", help="CSV to write (default: grades.csv)")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="seconds allowed per student and exercise (default: 60)")
    p.add_argument("--jobs", type=int, default=None,
                   help="files graded at a time (default: one per CPU core)")
    p.add_argument("--memory", type=float, default=4.0,
                   help="GB of memory for a file's student processes: each one's writable private memory, and all of them together (default: 4)")
    p.add_argument("--exercises", nargs="+", default=None, metavar="EXERCISE",
                   help="grade only these (default: all)")
    p.add_argument("--seed", type=int, help="inputs' seed, the same for every student")
    p.add_argument("--unconfined", action="store_true",
                   help="grade even where bubblewrap cannot run (student files then run "
                        "with your rights; refused without this flag)")
    p.set_defaults(run=_run_grade)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flashlib", description="The FlashAttention course's "
                                     "command line: grade exercises.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_check(sub)
    _add_grade(sub)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
