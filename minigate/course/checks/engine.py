"""The checks' engine: `check()` runs a learner's function on a few cases against an independent reference.

On a mismatch it looks for a *typical mistake*: a known-wrong variant of the reference that the learner's output
matches, and prints that mistake's hint; otherwise it names what is wrong: None or a wrong type or structure, a
wrong shape, or the first output outside the tolerance with its largest error and where it is. An exception
raised inside the learner's function fails the case too (chained, so its traceback stays available), naming the
case, its inputs' shapes and the exception's last line. Then:

    passed                     -> prints `✓ <exercise>: passed (N cases)` (or what `accepted` says: a prediction,
                                  which cannot be wrong, is `recorded`), returns the learner's function
    wrong or raised            -> prints `✗ ...` with the hint and raises AssertionError
    raises NotImplementedError -> prints a one-line notice and returns the reference, so the rest of the lesson
                                  runs (how the untouched lessons pass nbval); in grading mode it fails instead:
                                  not attempted

Grading mode is on with MINIGATE_GRADING=1 in the environment, or grading(True); with MINIGATE_GRADING unset, also
under nbgrader's autograde and validate (nbgrader sets NBGRADER_EXECUTION for the notebooks it runs), so an
nbgrader course needs no setting.
"""

from __future__ import annotations

import functools
import inspect
import numbers
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence

import torch

PASSED_RE = re.compile(r"^✓ (\S+): (?:passed \(\d+ cases?\)|recorded \([^()\n]*\))$", re.M)  # accepted
NOT_ATTEMPTED_RE = re.compile(r"✗ (\S+): not attempted")
GRADING_ENV = "MINIGATE_GRADING"
NBGRADER_ENV = "NBGRADER_EXECUTION"  # "autograde" or "validate" while nbgrader runs a notebook
NONE_HINT = "your function returned None: did you forget `return`?"

Case = tuple[str, tuple]  # (label shown in messages, positional arguments)
Mistake = tuple[str, Callable, str]  # (a label, a learner's function that makes the mistake, the hint it earns)
RaiseHint = tuple[str, str]  # (regex searched in "ExceptionType: message" of the learner's exception, hint)


class Mismatch(Exception):
    """Raised by a check's own wrappers when the learner's output cannot be read; the message is the hint."""


_grading: bool | None = None  # None: follow the environment variable


def grading(on: bool | None | str = "query") -> bool:
    """Grading mode: a stub that raises NotImplementedError fails its check instead of falling back.
    grading(True) / grading(False) switch it for this process, grading(None) follows the environment again
    (MINIGATE_GRADING when set, else whether nbgrader runs the notebook), grading() only reports whether it is on."""
    global _grading
    if on != "query":
        _grading = None if on is None else bool(on)
    if _grading is not None:
        return _grading
    if os.environ.get(GRADING_ENV, "").strip():
        return os.environ[GRADING_ENV].strip().lower() in ("1", "true", "yes", "on")
    return os.environ.get(NBGRADER_ENV, "") in ("autograde", "validate")


def not_implemented_notice(name: str) -> str:
    return f"… {name} not implemented yet: using the reference implementation so the rest of the lesson runs"


def not_attempted_message(name: str) -> str:
    return f"✗ {name}: not attempted (the exercise still raises NotImplementedError)"


def _fail(message: str, cause: BaseException | None = None):
    print(message)
    if cause is None:
        raise AssertionError(message)
    raise AssertionError(message) from cause


# ── reading outputs ───────────────────────────────────────────────────────────────────────────────────

def is_number(x) -> bool:
    """A real number, as a learner returns one (int, float, numpy scalar), and not a bool (True is an int in Python)."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def what(x) -> str:
    """A short description of a value, for hints."""
    if x is None:
        return "None"
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {tuple(x.shape)}"
    if isinstance(x, bool):
        return f"a bool ({x})"
    if isinstance(x, (int, float)):
        return f"a number ({x:.6g})"
    if isinstance(x, (tuple, list, dict, set)):
        return f"a {type(x).__name__} of {len(x)} item{'s' if len(x) != 1 else ''}"
    return f"a {type(x).__name__}"


def as_tree(x):
    """Numbers and arrays -> tensors, tuples and lists -> tuples; anything else is left as it is (a type the
    structure check then names). Numbers become float64, so ints up to 2**53 stay exact."""
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return torch.tensor(float(x), dtype=torch.float64)
    if isinstance(x, (tuple, list)):
        return tuple(as_tree(y) for y in x)
    if type(x).__module__ == "numpy":
        try:
            return torch.as_tensor(x)
        except (TypeError, ValueError, RuntimeError):
            return x
    return x


def _structure_hint(got, want, where: str = "") -> str | None:
    """None when `got` (as_tree'd) has the structure of `want` (as_tree'd), else a hint that names the problem."""
    if got is None:
        return f"{where}{NONE_HINT}" if where else NONE_HINT
    if isinstance(want, tuple):
        if not isinstance(got, tuple):
            return f"{where}expected {len(want)} outputs (a tuple), got {what(got)}"
        if len(got) != len(want):
            return f"{where}expected {len(want)} outputs, got {len(got)}"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            hint = _structure_hint(g, w, f"{where}output {i}: ")
            if hint:
                return hint
        return None
    if isinstance(got, tuple):
        return f"{where}expected {'a single number' if want.dim() == 0 else what(want)}, got a tuple or list of " \
               f"{len(got)} items"
    if not isinstance(got, torch.Tensor):
        return f"{where}expected {'a number' if want.dim() == 0 else what(want)}, got {what(got)}"
    if got.shape != want.shape and not got.numel() == 1 == want.numel():
        if want.dim() == 0:
            return f"{where}expected a single number, got a tensor of shape {tuple(got.shape)}"
        if got.dim() == 0:
            return f"{where}expected a tensor of shape {tuple(want.shape)}, got a single number"
        return f"{where}expected shape {tuple(want.shape)}, got {tuple(got.shape)}"
    if got.is_complex() or not (got.is_floating_point() or got.dtype in (torch.bool, *_INTS)):
        return f"{where}expected real numbers, got a tensor of dtype {got.dtype}"
    return None


_INTS = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def _leaves(got, want, path=()):
    if isinstance(want, tuple):
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            yield from _leaves(g, w, (*path, i))
    else:
        yield path, got.detach().reshape(want.shape).double(), want.detach().double()


def _close(got, want, tol: tuple[float, float]) -> bool:
    """got and want as_tree'd: the same structure and every number within atol + rtol * |want| (NaN == NaN)."""
    if _structure_hint(got, want) is not None:
        return False
    atol, rtol = tol
    return all(torch.isclose(g, w, atol=atol, rtol=rtol, equal_nan=True).all() for _, g, w in _leaves(got, want))


def _generic_hint(got, want, tol: tuple[float, float], index_label: Callable | None = None) -> str:
    """The first output outside the tolerance: its largest error and where it is (got and want as_tree'd, with
    the same structure)."""
    atol, rtol = tol
    for path, g, w in _leaves(got, want):
        if torch.isclose(g, w, atol=atol, rtol=rtol, equal_nan=True).all():
            continue
        where = f"output {', '.join(map(str, path))}: " if path else ""
        at = functools.partial(_at, shape=w.shape, index_label=index_label or _index)
        nan = torch.isnan(g) & ~torch.isnan(w)
        if nan.any():
            return f"{where}your output has NaNs{at(nan.flatten().nonzero()[0, 0])} (is a row of scores entirely " \
                   "-inf, or an exp overflowing?)"
        same = (g == w) | torch.isnan(g) & torch.isnan(w)
        diff = torch.where(same, 0.0, (g - w).abs()).nan_to_num(nan=float("inf"))  # a NaN where want has none: inf
        flat = diff.flatten().argmax()
        side = "" if g.flatten()[flat].isnan() else \
            f" (yours is {'higher' if g.flatten()[flat] > w.flatten()[flat] else 'lower'})"
        return f"{where}max |difference| = {diff.flatten()[flat].item():.3g}{at(flat)}{side}; print both on a small " \
               "case and compare"
    return "the output differs only within the tolerance's reach; print both on a small case and compare"


def _index(idx: tuple) -> str:
    return f"index {list(idx)}"


def _at(flat, shape, index_label: Callable) -> str:
    """" at index [1, 2]" (or what index_label says) for a flat position in a tensor of `shape`; "" for a scalar."""
    return "" if len(shape) == 0 else " at " + index_label(tuple(int(i) for i in torch.unravel_index(flat, shape)))


# ── describing a case's inputs ────────────────────────────────────────────────────────────────────────

def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return str(tuple(x.shape))
    if isinstance(x, (bool, int, float, str)) or x is None:
        return f"={x!r}"[:24]
    if isinstance(x, (list, tuple)):
        return f": {what(x)}"
    return f": {type(x).__name__}"


def _inputs(args: tuple, fn: Callable) -> str:
    try:
        names = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        names = []
    names = [n for n in names if n not in ("args", "kwargs")]
    names += [f"arg{i}" for i in range(len(names), len(args))]
    return ", ".join(f"{n}{'' if _describe(a).startswith(('=', ':')) else ' '}{_describe(a)}"
                     for n, a in zip(names, args, strict=False))


def _last_line(e: BaseException) -> str:
    lines = [line for line in str(e).strip().splitlines() if line.strip()]
    return f"{type(e).__name__}: {lines[-1].strip()}" if lines else type(e).__name__


# ── the check ─────────────────────────────────────────────────────────────────────────────────────────

def check(name: str, learner_fn: Callable, reference_fn: Callable, cases: Sequence[Case],
          mistakes: Sequence[Mistake] = (), atol: float = 1e-5, rtol: float = 1e-4, *,
          raises: Sequence[RaiseHint] = (), index_label: Callable | None = None,
          explain: Callable | None = None, wrap: Callable | None = None, accepted: str | None = None,
          refuse: Mapping[Callable, str] | None = None) -> Callable:
    """Compare learner_fn with reference_fn on every case; see the module docstring for what it returns.
    mistakes: the exercise's typical mistakes (its lesson module's MISTAKES[name]), each a function with the learner's
    signature; raises: hints for exceptions the learner's function raises; index_label(index tuple) -> "step 81"
    names an element in the generic hint; explain(got, want) -> a hint or None, tried before the generic hints;
    wrap(f) -> the function of a case's arguments whose outputs are compared, for an exercise whose answer must be
    run or read first (it may raise Mismatch): applied alike to the learner's function, the reference and each
    mistake, while the check still returns the learner's function or the reference itself; accepted: what the line
    of an accepted answer says after the name, "recorded (...)" for an answer that cannot be wrong (PASSED_RE);
    refuse: {library function: hint}, the library's one-call answers to an exercise that asks for the steps: a case in
    which the learner's run calls one fails with its hint (refusing(); the reference and the mistakes may call them)."""
    tol = (atol, rtol)
    run = wrap or (lambda f: f)
    learner, reference = run(learner_fn), run(reference_fn)
    learner = refusing(learner, refuse) if refuse else learner
    wrongs = [(run(wrong), hint) for _, wrong, hint in mistakes]
    clone = lambda args: tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)
    for label, args in cases:
        try:
            got = learner(*clone(args))
        except NotImplementedError as e:
            if _raised_by(e, learner_fn):  # the untouched stub's own `raise NotImplementedError`
                if grading():
                    _fail(not_attempted_message(name), e)
                print(not_implemented_notice(name))
                return reference_fn
            hint = next((h for pattern, h in raises if re.search(pattern, _last_line(e))), None)
            _fail(f"✗ {name}, case {label}: your function raised {_last_line(e)} inside a library it calls (inputs: "
                  f"{_inputs(args, reference)})" + (f"; {hint}" if hint else ""), e)
        except Mismatch as e:
            _fail(f"✗ {name}, case {label}: {e}", e)
        except Exception as e:  # the learner's own exception: a failed case, chained
            raised = _last_line(e)
            hint = next((h for pattern, h in raises if re.search(pattern, raised)), None)
            _fail(f"✗ {name}, case {label}: your function raised {raised} (inputs: {_inputs(args, reference)})"
                  + (f"; {hint}" if hint else ""), e)
        want = as_tree(reference(*clone(args)))
        got = as_tree(got)
        if _close(got, want, tol):
            continue
        hint = next((h for wrong, h in wrongs if _matches(got, wrong, clone(args), tol)), None)
        hint = hint or (explain(got, want) if explain else None) or _structure_hint(got, want) \
            or _generic_hint(got, want, tol, index_label)
        _fail(f"✗ {name}, case {label}: {hint}")
    print(f"✓ {name}: {accepted or f'passed ({len(cases)} case' + ('s' if len(cases) != 1 else '') + ')'}")
    return learner_fn


def refusing(fn: Callable, refuse: Mapping[Callable, str]) -> Callable:
    """fn, run so that a call to one of `refuse`'s Python functions while it runs (from fn, from anything it calls,
    from the hooks or the callback it built, which the check runs inside fn's run) raises Mismatch(that function's
    hint) once fn is done. The call is recognised by its code object, not by a name: a profile function
    (sys.setprofile), set for fn's run alone, looks at every Python frame that starts. So it is caught however the
    learner reached the function (`from minigate.overrides import forbid_bos`, `ov.forbid_bos`,
    `minigate.overrides.forbid_bos`, an alias), even when the learner's own function shadows the library's name;
    the reference and the mistakes, run outside fn, call the library freely. The profile function only records the
    first refused call and never raises (the refused function runs as usual); the Mismatch comes after."""
    hints = {inspect.unwrap(f).__code__: hint for f, hint in refuse.items()}

    def guarded(*args):
        called = []

        def profile(frame, event, arg):
            if event == "call" and not called and frame.f_code in hints:
                called.append(hints[frame.f_code])

        previous = sys.getprofile()
        sys.setprofile(profile)
        try:
            out = fn(*args)
        except Exception as e:
            if called:  # the refused call first: whatever failed after it is not the point
                raise Mismatch(called[0]) from e
            raise
        finally:
            sys.setprofile(previous)
        if called:
            raise Mismatch(called[0])
        return out
    return guarded


def _raised_by(e: BaseException, fn: Callable) -> bool:
    """Whether `e` was raised in fn's own body (a stub's `raise NotImplementedError`), not in something fn called
    (einops' einsum raises NotImplementedError for what it does not support: that is the learner's failed case)."""
    tb = e.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code is getattr(inspect.unwrap(fn), "__code__", None)


def _matches(got, wrong: Callable, args: tuple, tol) -> bool:
    try:
        return _close(got, as_tree(wrong(*args)), tol)
    except Exception:  # a wrong variant that cannot run on this case matches nothing
        return False


def randn(*shape, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
