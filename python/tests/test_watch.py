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


if __name__ == "__main__":
    unittest.main()
