"""Run by tests/test_trackers.py in a process of its own, for a tracker that reads its settings when imported (trackio's
TRACKIO_DIR): the user's run of tests/test_flight_recorder.py reporting to REPORT_TO, the recorder's trackers on or
off; prints what TRL logged each step, as JSON.

    python tests/tracked_run.py FOLDER MODEL REPORT_TO on|off
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_flight_recorder import TURNS_CONSTANT, user_run  # noqa: E402

if __name__ == "__main__":
    folder, model, report_to, trackers = sys.argv[1:5]
    _, logged, _ = user_run(Path(folder), Path(model), TURNS_CONSTANT, report_to=report_to, trackers=trackers == "on")
    print(json.dumps(logged))
