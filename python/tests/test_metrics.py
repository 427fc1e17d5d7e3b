"""drove.Metrics, drove-metrics' recorder from Python: bounded when the
coordinator is away, refusing use in a forked child, errors naming the
argument; and recording into a real coordinator (`drove coordinator`)."""

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import unittest

import drove

DROVE = os.environ.get("DROVE_BIN", "")
HAVE_DROVE = os.access(DROVE, os.X_OK)


def scratch(test, prefix):
    """A fresh folder for one test, removed when the test ends (pass or fail)."""
    path = tempfile.mkdtemp(prefix=prefix)
    test.addCleanup(shutil.rmtree, path, True)
    return path


def closed_port():
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Away(unittest.TestCase):
    def test_an_unreachable_coordinator_costs_points_not_the_run(self):
        m = drove.Metrics("127.0.0.1:%d" % closed_port(), run_id="r", rank=0, flush_timeout=0.5)
        m.record(1, "loss", 2.5)
        started = time.monotonic()
        delivery = m.close()
        self.assertLess(time.monotonic() - started, 20)
        self.assertEqual(delivery["recorded"], 1)
        self.assertEqual(delivery["undelivered"], 1)
        self.assertIn("not delivered", delivery["summary"])
        self.assertTrue(m.closed)
        self.assertIsNone(m.close())
        with self.assertRaisesRegex(RuntimeError, "closed"):
            m.record(2, "loss", 1.0)

    def test_a_forked_child_is_refused(self):
        m = drove.Metrics("127.0.0.1:%d" % closed_port(), run_id="r", rank=0, flush_timeout=0.1)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report what recording did, then leave at once
            try:
                m.record(1, "loss", 1.0)
                os.write(write, b"recorded")
            except RuntimeError as e:
                os.write(write, str(e).encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as f:
            said = f.read()
        os.waitpid(pid, 0)
        self.assertIn("cannot be used in process %d" % pid, said)
        m.record(1, "loss", 1.0)  # the parent's still works
        m.close()

    def test_bad_arguments_name_themselves(self):
        with self.assertRaisesRegex(ValueError, "flush_timeout must be a non-negative number of seconds"):
            drove.Metrics("127.0.0.1:1", run_id="r", rank=0, flush_timeout=-1)
        with self.assertRaises((TypeError, OverflowError)):
            drove.Metrics("127.0.0.1:1", run_id="r", rank=-1)
        m = drove.Metrics("127.0.0.1:%d" % closed_port(), run_id="r", rank=0, flush_timeout=0.1)
        with self.assertRaisesRegex(ValueError, "timeout must be"):
            m.flush(timeout=float("nan"))
        m.close()

    def test_no_coordinator_in_the_environment_means_no_recorder(self):
        if os.environ.get("DROVE_COORDINATOR"):
            self.skipTest("DROVE_COORDINATOR is set here")
        self.assertIsNone(drove.Metrics.from_env(rank=0))
        self.assertIsNone(drove.recorder())


@unittest.skipUnless(HAVE_DROVE, "DROVE_BIN names no drove binary (%r)" % DROVE)
class IntoACoordinator(unittest.TestCase):
    def test_points_and_an_event_reach_the_store(self):
        store = scratch(self, "drove-py-metrics-")
        port = closed_port()
        server = subprocess.Popen([DROVE, "coordinator", "--listen", "127.0.0.1:%d" % port, "--store", store],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            m = drove.Metrics("127.0.0.1:%d" % port, run_id="py-metrics", rank=1, flush_timeout=30)
            for step in range(5):
                m.record(step, "loss", 1.0 / (step + 1))
            # The first push may wait for the coordinator to start listening: bounded by the flush.
            self.assertEqual(m.flush(60), 5)
            m.event(4, drove.metric_names["EVENT_DIVERSITY_ALARM"], "a test alarm", timeout=30)
            delivery = m.close()
            self.assertEqual((delivery["delivered"], delivery["undelivered"]), (5, 0))
        finally:
            server.terminate()
            server.wait(30)
        shown = subprocess.run([DROVE, "metrics", "--store", store, "--run", "py-metrics", "--name", "loss",
                                "--agg", "raw", "--json"], capture_output=True, text=True, timeout=60)
        self.assertEqual(shown.returncode, 0, shown.stderr)
        self.assertEqual(shown.stdout.count('"loss"'), 5, shown.stdout)
        self.assertIn('"rank":1', shown.stdout.replace(" ", ""))


if __name__ == "__main__":
    unittest.main()


class Progress(unittest.TestCase):
    """drove.progress: the line drove-launch's bar reads, from rank 0 only."""

    def progress_in(self, env):
        code = "import drove; print(drove.progress(3, 10, loss=0.5, epoch=1))"
        clean = {k: v for k, v in os.environ.items() if not k.startswith("DROVE_")}
        done = subprocess.run([__import__("sys").executable, "-c", code], env=dict(clean, **env),
                              capture_output=True, text=True, timeout=60)
        self.assertEqual(done.returncode, 0, done.stderr)
        return done.stdout.strip(), done.stderr

    def test_rank_0_under_a_launcher_that_draws_sends_the_line(self):
        sent, err = self.progress_in({"DROVE_PROGRESS": "launcher", "DROVE_WORLD_SIZE": "2", "DROVE_RANK": "0"})
        self.assertEqual(sent, "True")
        line = [x for x in err.splitlines() if x.startswith("drove-progress ")]
        self.assertEqual(json.loads(line[0][len("drove-progress "):]),
                         {"step": 3, "total": 10, "epoch": 1, "loss": 0.5})

    def test_other_ranks_and_plain_runs_send_nothing(self):
        for env in ({"DROVE_PROGRESS": "launcher", "DROVE_WORLD_SIZE": "2", "DROVE_RANK": "1"}, {}):
            with self.subTest(env=env):
                sent, err = self.progress_in(env)
                self.assertEqual(sent, "False")
                self.assertNotIn("drove-progress", err)

    def test_a_step_past_the_total_is_named(self):
        with self.assertRaisesRegex(ValueError, "step 11 is past total 10"):
            drove.progress(11, 10)
