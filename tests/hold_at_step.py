"""python tests/hold_at_step.py STEP MARKER src/run.py ARGS...: run.py as the shell runs it
(alone or as a torchrun worker), except that its training holds after step STEP, with the
file MARKER written, until a stop signal (Ctrl-C, SIGTERM) arrives, and half a second more:
a second stop sent with the first (a Ctrl-C passed on again) arrives while it holds, and
stops the run at once, unsaved. A test then signals a run that is known to be
mid-training, instead of racing a fast run to its end."""

import os
import runpy
import sys
import time

step, marker, script = int(sys.argv[1]), sys.argv[2], sys.argv[3]
sys.argv = sys.argv[3:]  # as if `python src/run.py ARGS...` had been typed
sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
import machinery.cpu_libraries  # noqa: E402,F401 (before torch loads, as run.py does)

import trainer  # noqa: E402

update = trainer.Trainer.update
steps = {'n': 0}


def held_update(self, loss):
    update(self, loss)
    steps['n'] += 1
    if steps['n'] == step:
        with open(f"{marker}.{os.environ.get('RANK', '0')}", 'w') as f:
            f.write(f"held after step {step}\n")
        deadline = time.time() + 300  # a test that never signals fails instead of hanging
        while not self.stopper.asked() and time.time() < deadline:
            time.sleep(0.01)
        time.sleep(0.5)


trainer.Trainer.update = held_update
runpy.run_path(script, run_name='__main__')
