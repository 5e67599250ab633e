"""python -m minigate.data build-tokenizer | info"""

import argparse

from .python_files import stdlib_info
from .tokenizer import DEFAULT_TOKENIZER, build_tokenizer


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m minigate.data", description="minigate data utilities")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build-tokenizer",
                       help="retrain data/tokenizer.json (python-stdlib+wikitext-2, vocab 4096)")
    b.add_argument("--out", default=str(DEFAULT_TOKENIZER))
    b.add_argument("--vocab-size", type=int, default=4096)
    sub.add_parser("info", help="show what the python-stdlib corpus contains on this Python")
    args = p.parse_args(argv)
    if args.cmd == "build-tokenizer":
        build_tokenizer(args.out, args.vocab_size)
    else:
        print(stdlib_info())


if __name__ == "__main__":
    main()
