"""``python tests/record_eval_seeds.py FOLDER ARGS...``: ``scalelong ARGS...`` that also writes the
evaluation seeds each process samples to ``FOLDER/seeds-<rank>.jsonl``, one line per call. The
multi-process evaluation test starts it."""

import json
import os
import sys
from pathlib import Path

import scalelong.training.evaluation
from scalelong.cli import run


def recording(sample_features, folder: Path):
    def wrapper(model, cfg, features, seeds, *args, **kwargs):
        with (folder / f"seeds-{os.environ.get('RANK', '0')}.jsonl").open("a") as f:
            f.write(json.dumps(list(seeds)) + "\n")
        return sample_features(model, cfg, features, seeds, *args, **kwargs)

    return wrapper


if __name__ == "__main__":
    folder, argv = Path(sys.argv[1]), sys.argv[2:]
    folder.mkdir(parents=True, exist_ok=True)
    evaluation = scalelong.training.evaluation
    evaluation.sample_features = recording(evaluation.sample_features, folder)  # what score_model calls
    run(argv)
