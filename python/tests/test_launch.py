"""PyTorch programs under `drove run --np 4` (torchrun's variables, gloo):
the story's data path gives agreement 1.0 and the alarm, stored by the
coordinator and shown by `drove report`; drove's worker_init_fn (its rank
taken from torch.distributed, as the README shows) gives masks within 3 sigma
of 0.745, under fork and spawn; so do MaskedDataset's per-sample masks, with
grad_cosine gathered over gloo and recorded; mismatched shapes are an error
on every rank, never a hang."""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

try:
    import torch  # noqa: F401
except ImportError as e:
    if os.environ.get("DROVE_REQUIRE_TORCH") == "1":
        raise  # scripts/python-package.sh's run on the Python that has torch
    TORCH = "no torch here (%s): scripts/python-package.sh runs these on the Python that scripts/torch-tools.sh finds" % e
else:
    TORCH = ""

DROVE = os.environ.get("DROVE_BIN", "")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "python", "token_classifier.py")
WHY = TORCH or ("" if os.access(DROVE, os.X_OK) else "DROVE_BIN names no drove binary (%r)" % DROVE)
# A deadline for a whole launch: a hang fails the test instead of CI.
DEADLINE = 600


def scratch(test, prefix):
    """A fresh folder for one test, removed when the test ends (pass or fail)."""
    path = tempfile.mkdtemp(prefix=prefix)
    test.addCleanup(shutil.rmtree, path, True)
    return path


def drove_run(args, store, run_id, program):
    command = [DROVE, "run", "--np", str(args), "--store", store, "--run-id", run_id, "--",
               sys.executable] + program
    done = subprocess.run(command, capture_output=True, text=True, timeout=DEADLINE)
    lines = [re.sub(r"^\[\d+\] ", "", line) for line in done.stdout.splitlines()]
    rows = [json.loads(line) for line in lines if line.startswith("{")]
    return done, rows


@unittest.skipIf(WHY, WHY)
class TheStory(unittest.TestCase):
    """Runs of the example: {story, drove} seeding x {fork, spawn} start, and drove's per-sample masker."""

    def run_example(self, seeding, method, masker="story"):
        store = scratch(self, "drove-py-store-")
        run_id = "py-%s-%s-%s" % (seeding, method, masker)
        done, rows = drove_run(4, store, run_id, [
            EXAMPLE, "--seeding", seeding, "--masker", masker, "--start-method", method, "--workers", "4",
            "--steps", "12", "--diagnose-every", "5", "--sentences", "512"])
        self.assertEqual(done.returncode, 0, done.stdout[-3000:] + done.stderr[-3000:])
        self.assertEqual(sorted({r["rank"] for r in rows}), [0, 1, 2, 3], done.stdout[-2000:])
        self.assertEqual(sorted({r["step"] for r in rows}), [0, 5, 10])
        return store, run_id, rows

    def check_diverse(self, rows):
        for row in rows:
            m = row["masks"]
            self.assertEqual(m["verdict"], "diverse", row)
            self.assertLess(abs(m["mean_agreement"] - 0.745), 3 * m["sigma"], row)
            self.assertAlmostEqual(m["expected"], 0.745)
            self.assertFalse(m["alarm"])

    def check_identical(self, rows, store, run_id):
        for row in rows:
            self.assertEqual(row["masks"]["mean_agreement"], 1.0, row)
            self.assertEqual(row["masks"]["verdict"], "identical")
            self.assertTrue(row["masks"]["alarm"])
        points = subprocess.run([DROVE, "metrics", "--store", store, "--run", run_id, "--name",
                                 "diversity_alarm", "--json"], capture_output=True, text=True, timeout=120)
        self.assertEqual(points.returncode, 0, points.stderr)
        self.assertIn("diversity_alarm", points.stdout)
        out = scratch(self, "drove-py-report-")
        report = subprocess.run([DROVE, "report", "--store", store, "--run", run_id, "--out", out],
                                capture_output=True, text=True, timeout=300)
        self.assertEqual(report.returncode, 0, report.stderr)
        with open(os.path.join(out, "report.json")) as f:
            page = json.load(f)
        text = json.dumps(page)
        self.assertIn("Diversity alarm at step 0 (rank 0)", text)
        with open(os.path.join(out, "index.html")) as f:
            self.assertIn("Diversity alarm", f.read())

    def test_story_under_fork(self):
        store, run_id, rows = self.run_example("story", "fork")
        self.check_identical(rows, store, run_id)

    def test_story_under_spawn(self):
        store, run_id, rows = self.run_example("story", "spawn")
        self.check_identical(rows, store, run_id)

    def test_worker_init_fn_under_fork(self):
        self.check_diverse(self.run_example("drove", "fork")[2])

    def test_worker_init_fn_under_spawn(self):
        self.check_diverse(self.run_example("drove", "spawn")[2])

    def test_masked_dataset_and_grad_cosine_under_fork(self):
        store, run_id, rows = self.run_example("drove", "fork", masker="drove")
        self.check_diverse(rows)
        # grad_cosine gathers every rank's gradient over gloo: each rank
        # reports the same mean at a step, below 1 (their batches differ).
        for step in (0, 5, 10):
            means = {round(r["grad_cosine"], 12) for r in rows if r["step"] == step}
            self.assertEqual(len(means), 1, "ranks disagree on grad_cosine at step %d: %s" % (step, means))
            self.assertTrue(-1.0 <= means.pop() < 0.999, rows)
        points = subprocess.run([DROVE, "metrics", "--store", store, "--run", run_id, "--name",
                                 "grad_cosine", "--json"], capture_output=True, text=True, timeout=120)
        self.assertEqual(points.returncode, 0, points.stderr)
        self.assertIn("grad_cosine", points.stdout)


@unittest.skipIf(WHY, WHY)
class Shapes(unittest.TestCase):
    def test_different_shapes_are_an_error_on_every_rank(self):
        store = scratch(self, "drove-py-store-")
        done, rows = drove_run(3, store, "py-shapes", [os.path.join(ROOT, "python", "tests", "programs", "shapes.py")])
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
        self.assertEqual(sorted(r["rank"] for r in rows), [0, 1, 2])
        for r in rows:
            self.assertEqual(r["type"], "MaskShapeError")
            self.assertIn("rank(s) [0, 2] have 2 rows x 8 positions; rank(s) [1] have 3 rows x 8 positions",
                          r["error"])


if __name__ == "__main__":
    unittest.main()
