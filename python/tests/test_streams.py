"""drove.StreamKey against the Rust crates: the same derived seed and outputs
as `drove seed --json` (the binary named by DROVE_BIN) for every purpose, NumPy
generators that draw them, replay from a logged seed, and clear errors."""

import json
import os
import shutil
import subprocess
import unittest

import numpy as np

import drove
from drove import StreamKey

DROVE = os.environ.get("DROVE_BIN", "drove")
HAVE_DROVE = shutil.which(DROVE) is not None

KEYS = [
    ("augment", dict(seed=42, rank=1, worker=2, epoch=3)),
    ("augment", dict(seed=2**63 + 5, rank=7, worker=0, epoch=2**40)),
    ("shuffle", dict(seed=42, epoch=1)),
    ("init", dict(seed=0)),
    ("dropout", dict(seed=9, rank=3, step=4)),
    ("naive", dict(seed=42)),
]


def drove_seed(purpose, fields, lane=0):
    args = [DROVE, "seed", "--json", "--purpose", purpose, "--lane", str(lane)]
    for name, value in fields.items():
        args += [f"--{name}", str(value)]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


class SameAsRust(unittest.TestCase):
    def test_every_purpose_derives_drove_seed_s_seed_and_outputs(self):
        for purpose, fields in KEYS:
            for lane in (0, 3):
                with self.subTest(purpose=purpose, fields=fields, lane=lane):
                    key = getattr(StreamKey, purpose)(**fields).with_lane(lane)
                    rust = drove_seed(purpose, fields, lane)
                    self.assertEqual(key.derived_seed(), rust["derived_seed"])
                    self.assertEqual([hex(v) for v in key.outputs(4)],
                                     [hex(int(v, 16)) for v in rust["outputs"]])

    def test_numpy_s_pcg64_over_the_key_draws_the_same_outputs(self):
        for purpose, fields in KEYS:
            with self.subTest(purpose=purpose):
                key = getattr(StreamKey, purpose)(**fields)
                raw = key.numpy().bit_generator.random_raw(8)
                self.assertEqual([int(v) for v in raw], key.outputs(8))

    def test_a_logged_derived_seed_replays_its_stream(self):
        key = StreamKey.augment(seed=42, rank=1, worker=2, epoch=3)
        self.assertEqual(drove.replay_outputs(key.derived_seed(), 6), key.outputs(6))

    def test_streams_differ_across_ranks_workers_and_epochs_and_naive_is_one(self):
        seeds = {StreamKey.augment(seed=42, rank=r, worker=w, epoch=e).derived_seed()
                 for r in range(4) for w in range(4) for e in range(2)}
        self.assertEqual(len(seeds), 32)
        self.assertEqual(StreamKey.naive(seed=42), StreamKey.of("naive", seed=42))
        self.assertTrue(StreamKey.naive(seed=42).is_naive)

    def test_python_s_random_is_seeded_by_the_whole_key(self):
        a = StreamKey.augment(seed=42, rank=0).random().random()
        b = StreamKey.augment(seed=42, rank=1).random().random()
        self.assertNotEqual(a, b)
        self.assertEqual(a, StreamKey.augment(seed=42, rank=0).random().random())


class BadInput(unittest.TestCase):
    def test_an_unknown_purpose_names_the_argument(self):
        with self.assertRaisesRegex(ValueError, 'purpose: unknown purpose "mask"'):
            StreamKey.of("mask", seed=1)

    def test_a_field_the_purpose_lacks_is_refused(self):
        with self.assertRaisesRegex(ValueError, "a init key has no rank"):
            StreamKey.of("init", seed=1, rank=2)

    def test_out_of_range_and_wrong_types_raise(self):
        with self.assertRaisesRegex(ValueError, "rank must be below 2\\*\\*32"):
            StreamKey.augment(seed=1, rank=2**32)
        with self.assertRaises(OverflowError):
            StreamKey.augment(seed=-1, rank=0)
        with self.assertRaises(TypeError):
            StreamKey.augment(seed="42", rank=0)
        with self.assertRaisesRegex(ValueError, "derived_seed"):
            drove.replay_outputs("not hex")
        with self.assertRaisesRegex(TypeError, "derived_seed must be a str"):
            drove.replay_outputs(42)



class PerSample(unittest.TestCase):
    @unittest.skipUnless(HAVE_DROVE, "DROVE_BIN names no drove binary")
    def test_a_sample_s_stream_is_drove_seed_s(self):
        for purpose, seed, epoch, sample in (("augment", 42, 3, 7), ("shuffle", 9, 0, 0), ("dropout", 1, 2, 12345)):
            with self.subTest(purpose=purpose, sample=sample):
                streams = drove.SampleStreams(seed=seed, purpose=purpose, epoch=epoch)
                out = subprocess.run([DROVE, "seed", "--json", "--purpose", purpose, "--seed", str(seed),
                                      "--epoch", str(epoch), "--sample", str(sample)],
                                     check=True, capture_output=True, text=True).stdout
                rust = json.loads(out)
                self.assertEqual(streams.derived_seed(), rust["derived_seed"])
                self.assertEqual([hex(v) for v in streams.outputs(sample, 4)],
                                 [hex(int(v, 16)) for v in rust["outputs"]])

    def test_samples_differ_and_a_logged_family_replays(self):
        streams = drove.SampleStreams(seed=42, epoch=1)
        self.assertNotEqual(streams.outputs(1), streams.outputs(2))
        self.assertEqual(drove.replay_sample_outputs(streams.derived_seed(), 2, 6), streams.outputs(2, 6))
        self.assertIn("per-sample", repr(streams))
        with self.assertRaisesRegex(ValueError, "purpose: unknown purpose \"naive\""):
            drove.SampleStreams(seed=1, purpose="naive")
        with self.assertRaisesRegex(ValueError, "derived_seed"):
            drove.replay_sample_outputs("xyz", 1)


if __name__ == "__main__":
    unittest.main()
