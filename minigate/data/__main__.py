"""python -m minigate.data build-tokenizer | fetch-code | info"""

import argparse

from .code_wheels import fetch, python_code_info, wheel_dir
from .python_files import stdlib_info
from .tokenizer import DEFAULT_TOKENIZER, build_tokenizer


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m minigate.data", description="minigate data utilities")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build-tokenizer",
                       help="retrain data/tokenizer.json (python-stdlib+wikitext-2, vocab 4096)")
    b.add_argument("--out", default=str(DEFAULT_TOKENIZER))
    b.add_argument("--vocab-size", type=int, default=4096)
    f = sub.add_parser("fetch-code", help="fetch python-code's pinned wheels (data/python-code.lock.json) with pip")
    f.add_argument("--dest", help="a folder to fetch them into, e.g. to copy to a machine with no internet "
                                  "(default: the corpus cache, where python-code reads them)")
    sub.add_parser("info", help="show what the python-stdlib and python-code corpora contain")
    args = p.parse_args(argv)
    if args.cmd == "build-tokenizer":
        build_tokenizer(args.out, args.vocab_size)
    elif args.cmd == "fetch-code":
        paths = fetch(dest=args.dest)
        print(f"{len(paths)} wheels in {args.dest or wheel_dir()}")
    else:
        print("python-stdlib:", stdlib_info())
        print("python-code:", python_code_info())


if __name__ == "__main__":
    main()
