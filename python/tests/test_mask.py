"""drove.Masker against the Rust masker: the masks drove-collate's
`mask_fixture` example wrote (DROVE_MASK_FIXTURE), bit for bit, and clear
errors for bad input."""

import json
import os
import unittest

import numpy as np

from drove import Masker

FIXTURE = os.environ.get("DROVE_MASK_FIXTURE")


def masker(case, fixture):
    return Masker(mask_token=fixture["mask_token"], vocab_size=fixture["vocab_size"],
                  probability=case["probability"], mask_fraction=case["mask_fraction"],
                  random_fraction=case["random_fraction"], keep_fraction=case["keep_fraction"],
                  whole_word=case["whole_word"])


@unittest.skipUnless(FIXTURE, "DROVE_MASK_FIXTURE names no fixture (scripts/python-package.sh writes one)")
class SameAsRust(unittest.TestCase):
    def setUp(self):
        with open(FIXTURE) as f:
            self.fixture = json.load(f)

    def test_every_case_masks_as_the_rust_masker_did(self):
        fx = self.fixture
        samples = np.array(fx["samples"], dtype=np.int64)
        for case in fx["cases"]:
            for dtype in (np.int64, np.int32, np.uint32):
                with self.subTest(case=case["name"], dtype=dtype.__name__):
                    masked, actions = masker(case, fx).mask(
                        np.array(case["ids"], dtype=dtype), np.array(case["maskable"]),
                        seed=fx["seed"], epoch=fx["epoch"], samples=samples,
                        continues_word=np.array(case["continues_word"]))
                    self.assertEqual(masked.dtype, np.int64)
                    self.assertEqual(actions.dtype, np.uint8)
                    np.testing.assert_array_equal(masked, np.array(case["masked"]))
                    np.testing.assert_array_equal(actions, np.array(case["actions"]))

    def test_a_sample_s_mask_does_not_depend_on_its_batch(self):
        fx = self.fixture
        case = fx["cases"][0]
        m = masker(case, fx)
        ids, maskable = np.array(case["ids"]), np.array(case["maskable"])
        samples = np.array(fx["samples"], dtype=np.int64)
        whole, _ = m.mask(ids, maskable, seed=fx["seed"], epoch=fx["epoch"], samples=samples)
        for r in range(len(samples)):
            alone, _ = m.mask(ids[r:r + 1], maskable[r:r + 1], seed=fx["seed"], epoch=fx["epoch"],
                              samples=samples[r:r + 1])
            np.testing.assert_array_equal(alone[0], whole[r])


class BadInput(unittest.TestCase):
    def setUp(self):
        self.m = Masker(mask_token=103, vocab_size=30522)
        self.ids = np.full((2, 5), 1000, dtype=np.int64)
        self.maskable = np.ones((2, 5), dtype=bool)
        self.samples = np.array([0, 1], dtype=np.int64)

    def mask(self, **kw):
        args = dict(ids=self.ids, maskable=self.maskable, seed=1, epoch=0, samples=self.samples)
        args.update(kw)
        ids, maskable = args.pop("ids"), args.pop("maskable")
        return self.m.mask(ids, maskable, **args)

    def test_a_probability_outside_0_1_names_it(self):
        for p in (-0.1, 1.5, float("nan")):
            with self.subTest(p=p), self.assertRaisesRegex(ValueError, "probability"):
                Masker(mask_token=103, vocab_size=30522, probability=p)

    def test_a_mask_token_outside_the_vocabulary_is_refused(self):
        with self.assertRaisesRegex(ValueError, "mask token id 5 is outside the vocabulary of 5"):
            Masker(mask_token=5, vocab_size=5)

    def test_wrong_dtypes_and_ranks_name_the_argument(self):
        with self.assertRaisesRegex(TypeError, "ids must be a 2-D NumPy array .*float64"):
            self.mask(ids=self.ids.astype(np.float64))
        with self.assertRaisesRegex(TypeError, "ids must be a 2-D .*ndim 1"):
            self.mask(ids=self.ids[0])
        with self.assertRaisesRegex(TypeError, "maskable must be a 2-D NumPy array of bool"):
            self.mask(maskable=self.maskable.astype(np.int64))
        with self.assertRaisesRegex(TypeError, "samples must be a 1-D"):
            self.mask(samples=[0, 1])
        with self.assertRaisesRegex(TypeError, "ids must be"):
            self.mask(ids=[[1, 2], [3, 4]])

    def test_shapes_that_disagree_and_bad_values_are_named(self):
        with self.assertRaisesRegex(ValueError, r"maskable has shape \[2, 4\], but ids has shape \[2, 5\]"):
            self.mask(maskable=self.maskable[:, :4])
        with self.assertRaisesRegex(ValueError, "samples has 1 entries, but ids has 2 rows"):
            self.mask(samples=self.samples[:1])
        with self.assertRaisesRegex(ValueError, "samples: a negative index -1"):
            self.mask(samples=np.array([0, -1], dtype=np.int64))
        with self.assertRaisesRegex(ValueError, r"ids: a token id outside \[0, 2\*\*32\)"):
            self.mask(ids=np.full((2, 5), -3, dtype=np.int64))


if __name__ == "__main__":
    unittest.main()
