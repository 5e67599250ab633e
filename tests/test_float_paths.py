"""tests/float_paths.py, which `make test` and `make test-cpus` use to run notebooks under other float paths: the
forced environment reaches a fresh process, and make test's second path is narrower than the machine's own."""

import platform

import pytest

import float_paths as fp  # tests/, on the path as pytest imports the test files there

x86 = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="ATen's x86 paths")


def test_the_other_path_is_the_next_narrower_one():
    assert fp.other("AVX512") == fp.PATHS["avx2"]
    assert fp.other("AVX2") == fp.PATHS["default"]
    assert fp.other("DEFAULT") == fp.PATHS["default"]


@x86
@pytest.mark.slow
def test_a_forced_path_reaches_a_fresh_process_and_differs_from_the_native_one():
    native = fp.capability({})
    assert fp.capability(fp.PATHS["default"]) == "DEFAULT"
    forced = fp.capability(fp.other(native))
    assert forced != native or native == "DEFAULT", f"make test's second path ({forced}) is the machine's own"


def test_show_names_the_path(capsys):
    assert fp.main(["--show"]) == 0
    assert capsys.readouterr().out.startswith("float path: ATen ")
