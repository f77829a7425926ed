"""Stored outputs that every machine reproduces: numbers, and progress bars.

The lessons' stored outputs are checked with strict nbval on the learner's machine, so a
printed number must not depend on rounding noise: float32 sums come out in a different
order with another CPU's vector kernels (AVX-512, AVX2, NEON) or another thread count, and
move in their last bits. Two helpers keep only what every correct machine agrees on:

- :func:`below` reports a difference from a reference as a bound ("below 1e-05"), never
  as the noise itself ("3.6e-07" here, "3.9e-07" there);
- :func:`fixed` prints a value with a fixed number of decimals, and refuses (at the time
  the lesson is written) a value so close to a rounding boundary that noise could flip
  its last digit.

:func:`progress` is ``tqdm.auto.tqdm`` for cells that run more than a few seconds: live,
it is the usual bar; stored in the notebook (where the widget's state is not), it reads
as finished ("100%|██████████| 4/4"), not as the first frame ("0%| | 0/4 [00:00<?]").

docs/determinism.md says more, and why ``make test`` checks the notebooks with another
set of CPU kernels than the one that stored their outputs.
"""

import math

from tqdm.auto import tqdm
from tqdm.notebook import tqdm as notebook_tqdm

# How far rounding noise may move a value computed in float32 (relative), with a margin:
# a few ulps of float32 (1.2e-7): the issue saw 4.440228 here and 4.440227 there.
NOISE = 1e-6


def below(value, bound):
    """``"below 1e-05"`` if ``value < bound``, else the value and the bound it broke.

    ``bound`` is chosen by the lesson, well above the noise (float32 differences are around
    1e-7 of the values compared), so every correct machine prints the same words; a
    wrong result prints its size, and nbval fails on it.
    """
    value, bound = float(value), float(bound)
    if math.isnan(value):
        return f"nan (not below {bound:.0e})"
    if value < bound:
        return f"below {bound:.0e}"
    return f"{value:.1e}, not below {bound:.0e}"


def fixed(value, decimals, noise=NOISE):
    """``value`` with ``decimals`` decimals, e.g. ``fixed(4.440227, 3) == "4.440"``.

    Raises ValueError when a relative change of ``noise`` could round it the other way
    (4.324452 to 4 decimals is 4.3245, but 4.324449 is 4.3244): print fewer decimals.
    """
    value = float(value)
    if math.isnan(value) or math.isinf(value):
        return str(value)
    text = f"{value:.{decimals}f}"
    wobble = noise * max(abs(value), 10.0 ** -decimals)
    if f"{value - wobble:.{decimals}f}" != text or f"{value + wobble:.{decimals}f}" != text:
        raise ValueError(f"{value!r} printed with {decimals} decimals could print differently "
                         f"on another CPU (it is within {noise:g} of a rounding boundary, relative): "
                         f"print fewer decimals")
    return text


def progress(iterable, desc, total=None):
    """``tqdm.auto.tqdm(iterable, desc=desc)``, whose stored output shows it finished.

    In a notebook the bar is a widget, and a saved notebook keeps only its plain-text
    stand-in, written when the bar first appears: tqdm's own says "0%" forever (and nbval
    compares it). Here that text is the bar's last frame, without times.
    """
    total = len(iterable) if total is None else total
    if not issubclass(tqdm, notebook_tqdm):          # a terminal: tqdm's own text bar
        return tqdm(iterable, desc=desc, total=total)
    from IPython.display import display
    bar = tqdm(iterable, desc=desc, total=total, display=False)
    bundle = bar.container._repr_mimebundle_()
    bundle["text/plain"] = f"{desc}: 100%|{'█' * 10}| {total}/{total}"
    display(bundle, raw=True)
    bar.displayed = True
    return bar
