"""flashcute's forward benchmark: ``python -m flashcute.bench`` (``--help`` lists the options).

At every point of a grid (dtype x head dim x causal x seqlen; FlashAttention's sizes by default) it

1. checks each implementation's output with the project's shared reference and rule,
   :func:`flashcute.testing.check_attention` (on batch 0 and two heads when the problem is large);
   a wrong flashcute result makes the exit code 3, and the other points still run;
2. times flashcute, torch SDPA's flash, cuDNN and memory-efficient backends and, when it imports,
   FlashAttention-4 (``fa4``) in the same process, on the same inputs, by the standard timing
   (:mod:`.timing`): per implementation a warm-up, then back-to-back calls each between CUDA
   events with L2 flushed between them, the implementations in order and then in reverse, the
   median of the timed calls; ``--timing turns`` takes them in turns instead;
3. reports TFLOP/s (FlashAttention's count: 4*B*H*Sq*Sk*D, halved when causal) in a log line per
   point, a table, a CSV, a JSON file (GPU, versions, date, every timing), a PNG plot, and a final
   line starting ``flashcute.bench summary [GPU, standard timing]:``. Each of them names the
   timing that produced its numbers.

With CuPy and no torch it times flashcute alone. With no GPU it says why and exits 1.

Exit codes: 0 every checked point passed; 1 no usable GPU, or flashcute not built; 2 usage error,
or neither torch nor CuPy installed; 3 a flashcute correctness check failed or flashcute raised.

The modules, each one job:

- :mod:`.cli`: the arguments (:class:`~.cli.BenchConfig`) and :func:`main`, which runs it all;
- :mod:`.grid`: the points and their FLOP counts;
- :mod:`.arrays`: torch or CuPy, which make the inputs, describe the device and own the events;
- :mod:`.impls`: the implementations (:class:`~.impls.Impl`; add a peer or a pass here);
- :mod:`.check`: the correctness check, on the slice of the output that is checked;
- :mod:`.timing`: the one timer, its two schedules (standard, turns) and the L2 flush;
- :mod:`.run`: one point: inputs, then check and time every implementation;
- :mod:`.results`: what a point produces;
- :mod:`.report`: the console (rich, else plain prints), the per-point line, the table, the summary;
- :mod:`.files`: the CSV, JSON and PNG files, from one record builder;
- :mod:`.decode`: ``python -m flashcute.bench decode``, KV-cache decode bandwidth against SDPA;
- :mod:`.varlen`: ``python -m flashcute.bench varlen``, packed against padded prefill.

Importing any of them needs only the standard library and flashcute: torch, CuPy, NumPy, rich and
matplotlib are imported when used.
"""

from .cli import main

__all__ = ["main"]
