"""The watcher `drove run` puts into every Python rank, on the zoo's programs
(bench/zoo/), none changed for it: the story, a NumPy `worker_init_fn`
without the rank, and `torch.manual_seed` in workers each raise the
diversity alarm on rank 0's stderr naming the stream and its fix, and a
point in the coordinator; each fixed is diverse (mask agreement near 0.745);
a correct program raises nothing; and the story under torchrun through
`python -m drove.watch`. Sized for CI's 2 cores: 4 ranks, 2 epochs of 6
batches."""

import os
import re
import subprocess
import sys
import unittest

from test_launch import DEADLINE, DROVE, ROOT, WHY, scratch

NO_DROVE = "" if os.access(DROVE, os.X_OK) else "DROVE_BIN names no drove binary (%r)" % DROVE

ZOO = os.path.join(ROOT, "bench", "zoo")
ALARM = "[0] drove-watch: diversity alarm: "
IN_FULL = "[0] drove-watch: diversity alarm, in full: "


def watched(test, program, *flags, workers=4, method="fork", epochs=2):
    """`drove run --np 4` of a zoo program: (returncode, stderr, the summary's agreement)."""
    store = scratch(test, "drove-watch-store-")
    command = [DROVE, "run", "--np", "4", "--store", store, "--run-id", "watch", "--",
               sys.executable, os.path.join(ZOO, program), "--epochs", str(epochs), "--batches", "6",
               "--workers", str(workers), "--start-method", method] + list(flags)
    env = dict(os.environ, DROVE_WATCH_EVERY="3")
    done = subprocess.run(command, capture_output=True, text=True, timeout=DEADLINE, env=env)
    test.assertEqual(done.returncode, 0, done.stdout[-3000:] + done.stderr[-3000:])
    summary = re.search(r"mean agreement ([0-9.]+) against ([0-9.]+) for independent masks, (\d+) beyond",
                        done.stderr)
    test.assertIsNotNone(summary, done.stderr[-3000:])
    return done.stderr, store, float(summary.group(1)), int(summary.group(3))


@unittest.skipIf(WHY, WHY)
class TheZoo(unittest.TestCase):
    def assert_alarm(self, stderr, stream, fix):
        lines = stderr.splitlines()
        first = [line for line in lines if line.startswith(ALARM + stream)]
        self.assertEqual(len(first), 1, stderr[-3000:])
        self.assertIn(fix, first[0])
        # At the end, in full: worker k of every rank, the four ranks named.
        full = [line for line in lines if line.startswith(IN_FULL + stream)]
        self.assertEqual(len(full), 1, stderr[-3000:])
        self.assertIn("worker 0 of ranks 0, 1, 2, 3; worker 1 of ranks 0, 1, 2, 3", full[0])

    def assert_diverse(self, stderr, agreement, beyond):
        self.assertNotIn("diversity alarm", stderr)
        self.assertEqual(beyond, 0, stderr[-2000:])
        self.assertLess(abs(agreement - 0.745), 0.03, stderr[-2000:])

    def test_the_story_under_fork_and_its_fix(self):
        stderr, store, agreement, beyond = watched(self, "story.py")
        self.assert_alarm(stderr, "Python's random (loader 0, epoch 0): ", "worker_init_fn")
        self.assertIn("drove-watch: diversity alarm: the MLM masks of batch ", stderr)
        self.assertEqual(agreement, 1.0)
        points = subprocess.run([DROVE, "metrics", "--store", store, "--run", "watch", "--name",
                                 "diversity_alarm", "--json"], capture_output=True, text=True, timeout=120)
        self.assertEqual(points.returncode, 0, points.stderr)
        self.assertIn("diversity_alarm", points.stdout)
        # The report's verdict, from the alarm's event in the store.
        out = scratch(self, "drove-watch-report-")
        report = subprocess.run([DROVE, "report", "--store", store, "--run", "watch", "--out", out],
                                capture_output=True, text=True, timeout=300)
        self.assertEqual(report.returncode, 0, report.stderr)
        with open(os.path.join(out, "report.json")) as f:
            self.assertIn("Diversity alarm at step 0 (rank 0): Python's random", f.read())
        stderr, _, agreement, beyond = watched(self, "story.py", "--fix")
        self.assert_diverse(stderr, agreement, beyond)

    def test_a_numpy_worker_init_fn_without_the_rank_and_its_fix(self):
        stderr, _, agreement, _ = watched(self, "numpy_worker_init.py")
        self.assert_alarm(stderr, "NumPy's global state (loader 0, epoch 0): ", "worker_init_fn")
        self.assertEqual(agreement, 1.0)
        stderr, _, agreement, beyond = watched(self, "numpy_worker_init.py", "--fix")
        self.assert_diverse(stderr, agreement, beyond)

    def test_torch_manual_seed_in_workers_under_spawn_and_its_fix(self):
        stderr, _, agreement, _ = watched(self, "torch_manual_seed.py", workers=2, method="spawn", epochs=1)
        self.assert_alarm(stderr, "torch's default generator (loader 0, epoch 0): ", "worker_init_fn")
        # Python's random and NumPy's state are shared too, but never drawn from: warnings.
        self.assertIn("[0] drove-watch: warning: Python's random", stderr)
        stderr, _, agreement, beyond = watched(self, "torch_manual_seed.py", "--fix")
        self.assert_diverse(stderr, agreement, beyond)

    def test_the_story_under_torchrun_through_python_m_drove_watch(self):
        # No drove run: torchrun starts the ranks, the watcher comes from the
        # installed package, and the ranks compare through the program's gloo group.
        # `--redirects 1 --tee 1`: Debian's torch 1.13 on Python 3.11 cannot
        # read torchrun's default "0" (IntFlag no longer iterates its zero);
        # stdout goes to a log and to the console, stderr as it is.
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "4",
                   "--redirects", "1", "--tee", "1", "-m", "drove.watch", os.path.join(ZOO, "story.py"), "--epochs", "2", "--batches", "6"]
        env = dict(os.environ, DROVE_WATCH_EVERY="3", OMP_NUM_THREADS="1")
        done = subprocess.run(command, capture_output=True, text=True, timeout=DEADLINE, env=env)
        self.assertEqual(done.returncode, 0, done.stdout[-3000:] + done.stderr[-3000:])
        lines = [line for line in done.stderr.splitlines() if line.startswith("drove-watch: ")]
        self.assertTrue(any(line.startswith("drove-watch: diversity alarm: Python's random (loader 0, epoch 0)")
                            for line in lines), done.stderr[-3000:])
        full = [line for line in lines if line.startswith("drove-watch: diversity alarm, in full: Python's random")]
        self.assertEqual(len(full), 1, lines)
        self.assertIn("worker 0 of ranks 0, 1, 2, 3", full[0])
        self.assertIn("mean agreement 1.0000", done.stderr)

    def test_a_correct_program_raises_nothing(self):
        stderr, _, agreement, beyond = watched(self, "correct.py")
        self.assert_diverse(stderr, agreement, beyond)
        self.assertNotIn("drove-watch: warning", stderr)



def plain_run(test, code, *flags, env=None):
    """`drove run --np 2` of `python -c code` (no torch needed): (returncode, stdout, stderr)."""
    command = [DROVE, "run", "--np", "2"] + list(flags) + ["--", sys.executable, "-c", code]
    done = subprocess.run(command, capture_output=True, text=True, timeout=DEADLINE,
                          env=dict(os.environ, **(env or {})))
    test.assertEqual(done.returncode, 0, done.stdout[-3000:] + done.stderr[-3000:])
    return done.stdout, done.stderr


@unittest.skipIf(NO_DROVE, NO_DROVE)
class TheWatcherItself(unittest.TestCase):
    """What needs no torch: the watcher goes in, the program's own sitecustomize
    still runs, --no-watch keeps it out, and a DataLoader it cannot watch is
    said once, on rank 0."""

    WATCHED = "import sys; print('watched', 'drove_watch' in sys.modules)"

    def test_the_program_s_own_sitecustomize_still_runs_after_the_watcher(self):
        own = scratch(self, "drove-watch-site-")
        with open(os.path.join(own, "sitecustomize.py"), "w") as f:
            f.write("import sys\nprint('own sitecustomize ran, watcher in:', 'drove_watch' in sys.modules)\n")
        stdout, _ = plain_run(self, self.WATCHED, env={"PYTHONPATH": own})
        for rank in (0, 1):
            self.assertIn("[%d] own sitecustomize ran, watcher in: True" % rank, stdout)
            self.assertIn("[%d] watched True" % rank, stdout)
        stdout, _ = plain_run(self, self.WATCHED, "--no-watch", env={"PYTHONPATH": own})
        self.assertIn("[0] own sitecustomize ran, watcher in: False", stdout)
        self.assertIn("[1] watched False", stdout)

    def test_watch_forces_the_watcher_into_a_program_that_starts_python_itself(self):
        script = "exec %s -c \"%s\"" % (sys.executable, self.WATCHED)
        for flags, watched in (([], False), (["--watch"], True)):
            command = [DROVE, "run", "--np", "2"] + flags + ["--", "sh", "-c", script]
            done = subprocess.run(command, capture_output=True, text=True, timeout=DEADLINE)
            self.assertEqual(done.returncode, 0, done.stderr[-3000:])
            self.assertIn("[1] watched %s" % watched, done.stdout, flags)

    def test_a_dataloader_it_cannot_watch_is_said_once_on_rank_0(self):
        fake = scratch(self, "drove-watch-fake-torch-")
        package = os.path.join(fake, "torch", "utils", "data")
        os.makedirs(package)
        for folder in ("torch", "torch/utils", "torch/utils/data"):
            with open(os.path.join(fake, folder, "__init__.py"), "w") as f:
                f.write("__version__ = '0.0-fake'\n" if folder == "torch" else "")
        with open(os.path.join(package, "dataloader.py"), "w") as f:
            f.write("class DataLoader:\n    pass\n")  # no _BaseDataLoaderIter
        _, stderr = plain_run(self, "import torch.utils.data.dataloader", env={"PYTHONPATH": fake})
        said = [line for line in stderr.splitlines() if "drove-watch: cannot watch this program" in line]
        self.assertEqual(len(said), 1, stderr[-3000:])
        self.assertTrue(said[0].startswith("[0] drove-watch: cannot watch this program: torch 0.0-fake's DataLoader"),
                        said)


if __name__ == "__main__":
    unittest.main()
