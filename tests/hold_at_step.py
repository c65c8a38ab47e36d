"""python tests/hold_at_step.py STEP MARKER src/run.py ARGS...: run.py as the shell runs it
(alone or as a torchrun worker), except that its training holds after step STEP, with the
file MARKER written, until a stop signal (Ctrl-C, SIGTERM) arrives. A test then signals a
run that is known to be mid-training, instead of racing a fast run to its end."""

import os
import runpy
import sys
import time

step, marker, script = int(sys.argv[1]), sys.argv[2], sys.argv[3]
sys.argv = sys.argv[3:]  # as if `python src/run.py ARGS...` had been typed
sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
import cpu_libraries  # noqa: E402,F401 (before torch loads, as run.py does)

import resume  # noqa: E402

after_step = resume.Stopper.after_step


def held_after_step(stopper, epoch, step_in_epoch, logged):
    if stopper.run.done == step:
        with open(f"{marker}.{os.environ.get('RANK', '0')}", 'w') as f:
            f.write(f"held after step {step}\n")
        deadline = time.time() + 300  # a test that never signals fails instead of hanging
        while stopper.signal is None and time.time() < deadline:
            time.sleep(0.01)
    return after_step(stopper, epoch, step_in_epoch, logged)


resume.Stopper.after_step = held_after_step
runpy.run_path(script, run_name='__main__')
