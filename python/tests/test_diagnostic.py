"""The diagnostic's core (drove.agreement and the gathering every framework
module shares) on ranks as threads: the same numbers as drove-collate's
accumulator, every rank raising on mismatched shapes, never a hang."""

import os
import unittest

import numpy as np

import drove
from drove import _diagnostic, _drove

from world import ThreadWorld


def random_masks(world, rows, cols, p, seed, identical=False):
    rng = np.random.default_rng(seed)
    chosen = rng.random((1 if identical else world, rows, cols)) < p
    if identical:
        chosen = np.repeat(chosen, world, axis=0)
    maskable = np.ones((world, rows, cols), bool)
    maskable[:, :, cols - 3:] = False  # padding
    return chosen, maskable


class Agreement(unittest.TestCase):
    def test_identical_masks_agree_fully_and_sound_the_alarm(self):
        chosen, maskable = random_masks(4, 16, 64, 0.15, 1, identical=True)
        r = drove.agreement(chosen, maskable, probability=0.15)
        self.assertEqual(r.mean_agreement, 1.0)
        self.assertEqual(r.verdict, "identical")
        self.assertTrue(r.alarm)
        self.assertAlmostEqual(r.expected, 0.745)
        self.assertAlmostEqual(r.normalised, 1.0)

    def test_independent_masks_are_diverse(self):
        chosen, maskable = random_masks(4, 16, 64, 0.15, 2)
        r = drove.agreement(chosen, maskable, probability=0.15)
        self.assertLess(abs(r.mean_agreement - 0.745), 3 * r.sigma)
        self.assertEqual(r.verdict, "diverse")
        self.assertFalse(r.alarm)
        self.assertEqual(len(r.pairs), 6)
        self.assertEqual(r.pairs[0][3], 16 * 61)  # positions maskable on both

    def test_agreement_counts_only_positions_maskable_on_both(self):
        chosen = np.array([[[True, False, True]], [[True, True, False]]])
        maskable = np.array([[[True, True, False]], [[True, True, True]]])
        r = drove.agreement(chosen, maskable, probability=0.5)
        self.assertEqual(r.pairs, [(0, 1, 0.5, 2)])

    def test_bad_input_names_the_argument(self):
        ok = np.zeros((2, 3, 4), bool)
        with self.assertRaisesRegex(TypeError, "chosen must be a 3-D NumPy array of bool"):
            drove.agreement(np.zeros((2, 3), bool), ok, probability=0.15)
        with self.assertRaisesRegex(TypeError, "maskable must be .*got ndarray \\(dtype int64"):
            drove.agreement(ok, np.zeros((2, 3, 4), np.int64), probability=0.15)
        with self.assertRaisesRegex(ValueError, "probability must be in \\[0, 1\\], got 1.5"):
            drove.agreement(ok, ok, probability=1.5)
        with self.assertRaisesRegex(ValueError, "maskable has shape \\[2, 3, 5\\]"):
            drove.agreement(ok, np.zeros((2, 3, 5), bool), probability=0.15)
        with self.assertRaisesRegex(ValueError, "probability must be in"):
            drove.expected_agreement(-0.1)


class Gathered(unittest.TestCase):
    def test_every_rank_gets_the_report_of_the_stacked_masks(self):
        chosen, maskable = random_masks(4, 8, 32, 0.15, 3)
        world = ThreadWorld(4)
        reports = world.run(lambda r: _diagnostic.mask_agreement(
            world.gather(r), r, 4, chosen[r], maskable[r], 0.15, None, False))
        direct = drove.agreement(chosen, maskable, probability=0.15)
        for r in reports:
            self.assertNotIsInstance(r, BaseException, r)
            self.assertEqual(r.to_dict(), direct.to_dict())

    def test_different_shapes_raise_on_every_rank_naming_them(self):
        world = ThreadWorld(3)

        def body(rank):
            rows = 5 if rank == 2 else 4
            return _diagnostic.mask_agreement(world.gather(rank), rank, 3, np.zeros((rows, 8), bool),
                                              None, 0.15, 0, False)

        for result in world.run(body):
            self.assertIsInstance(result, _diagnostic.MaskShapeError)
            self.assertIn("rank(s) [0, 1] have 4 rows x 8 positions", str(result))
            self.assertIn("rank(s) [2] have 5 rows x 8 positions", str(result))

    def test_one_rank_with_bad_input_makes_every_rank_raise(self):
        world = ThreadWorld(2)

        def body(rank):
            mask = np.zeros((4, 8), bool) if rank == 0 else np.zeros((2, 4, 8), bool)
            return _diagnostic.mask_agreement(world.gather(rank), rank, 2, mask, None, 0.15, 0, False)

        for result in world.run(body):
            self.assertIsInstance(result, ValueError)
            self.assertIn("rank(s) [1] passed a mask that is not 1-D or 2-D", str(result))

    def test_a_probability_outside_0_1_on_one_rank_is_named_on_every_rank(self):
        world = ThreadWorld(2)
        results = world.run(lambda r: _diagnostic.mask_agreement(
            world.gather(r), r, 2, np.zeros((2, 2), bool), None, 1.2 if r else 0.15, 0, False))
        for result in results:
            self.assertIn("rank(s) [1] passed a probability outside [0, 1]", str(result))

    def test_grad_cosine_of_equal_and_opposite_gradients(self):
        world = ThreadWorld(3)
        grads = [np.array([1.0, 2.0]), np.array([2.0, 4.0]), np.array([-1.0, -2.0])]
        results = world.run(lambda r: _diagnostic.grad_cosine(world.gather(r), r, 3, grads[r], 0, False))
        for result in results:
            self.assertAlmostEqual(result.matrix[0][1], 1.0)
            self.assertAlmostEqual(result.matrix[0][2], -1.0)
            self.assertAlmostEqual(result.mean, (1.0 - 1.0 - 1.0) / 3)

    def test_grad_cosine_is_the_rust_one_and_matches_numpy(self):
        # drove-diagnostic computes it (as for the Rust trainer); NumPy is the oracle.
        rng = np.random.default_rng(7)
        every = np.vstack([rng.standard_normal(50), rng.standard_normal(50), np.zeros(50)])
        matrix, mean = _drove.grad_cosine(every)
        norms = np.linalg.norm(every, axis=1)
        norms[norms == 0] = 1.0
        unit = every / norms[:, None]
        expected = unit @ unit.T
        np.testing.assert_allclose(np.array(matrix), expected, atol=1e-12)
        self.assertAlmostEqual(mean, (expected[0, 1] + expected[0, 2] + expected[1, 2]) / 3, places=12)
        self.assertEqual(matrix[2][2], 0.0)
        with self.assertRaisesRegex(TypeError, "2-D NumPy array of float64"):
            _drove.grad_cosine(np.ones(3))

    def test_a_missing_gradient_is_named_on_every_rank(self):
        world = ThreadWorld(2)
        results = world.run(lambda r: _diagnostic.grad_cosine(
            world.gather(r), r, 2, None if r == 1 else np.ones(3), 0, False))
        for result in results:
            self.assertIn("rank(s) [1] passed a parameter with no gradient yet", str(result))


class Recorded(unittest.TestCase):
    """What the diagnostic records, into a stand-in with drove.Metrics' methods."""

    class Points:
        def __init__(self):
            self.points, self.events = [], []

        def record(self, step, name, value):
            self.points.append((step, name, value))

        def event(self, step, kind, message):
            self.events.append((step, kind, message))

    def test_the_alarm_records_the_point_everywhere_and_the_event_from_rank_0(self):
        chosen, maskable = random_masks(2, 8, 32, 0.15, 4, identical=True)
        world = ThreadWorld(2)
        sinks = [self.Points(), self.Points()]
        world.run(lambda r: _diagnostic.mask_agreement(
            world.gather(r), r, 2, chosen[r], maskable[r], 0.15, 7, sinks[r]))
        names = drove.metric_names
        for rank, sink in enumerate(sinks):
            recorded = {name: (step, value) for step, name, value in sink.points}
            self.assertEqual(recorded[names["MASK_AGREEMENT"]], (7, 1.0))
            self.assertEqual(recorded[names["DIVERSITY_ALARM"]], (7, 1.0))
            self.assertIn(names["MASK_AGREEMENT_SIGMA"], recorded)
            self.assertEqual(recorded[names["WORLD_SIZE"]], (7, 2))
            self.assertEqual(len(sink.events), 1 if rank == 0 else 0)
        self.assertEqual(sinks[0].events[0][:2], (7, "diversity_alarm"))


class Names(unittest.TestCase):
    def test_every_recorded_name_reaches_python(self):
        # drove-proto lists every name it declares; none is copied by hand.
        names = drove.metric_names
        for key, name in (("GENERATION", "generation"), ("EVENT_OPTIONS", "options"),
                          ("EVENT_REFORM", "reform"), ("GRAD_COSINE", "grad_cosine")):
            self.assertEqual(names[key], name)
        self.assertEqual(len(names), 16)


class Panics(unittest.TestCase):
    def test_a_panic_in_the_extension_is_a_python_exception(self):
        from drove import _drove

        # The panic is on purpose: no backtrace of it in the test log (Rust reads
        # RUST_BACKTRACE at a process's first panic).
        backtrace = os.environ.get("RUST_BACKTRACE")
        os.environ["RUST_BACKTRACE"] = "0"
        try:
            with self.assertRaises(BaseException) as caught:
                _drove._panic_for_tests("boom")
        finally:
            if backtrace is None:
                del os.environ["RUST_BACKTRACE"]
            else:
                os.environ["RUST_BACKTRACE"] = backtrace
        self.assertEqual(type(caught.exception).__name__, "PanicException")
        self.assertIn("boom", str(caught.exception))
        # The interpreter and the module go on working.
        self.assertAlmostEqual(drove.expected_agreement(0.5), 0.5)


if __name__ == "__main__":
    unittest.main()
