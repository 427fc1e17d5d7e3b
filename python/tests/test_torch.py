"""drove.torch with a real PyTorch (Debian's python3-torch in CI): worker
seeding under fork and spawn, drove's sampler and per-sample masks against
the Rust crates, the diagnostic over gloo, and drove.horovod beside it."""

import json
import os
import random
import subprocess
import unittest

import numpy as np

try:
    import torch
    import torch.utils.data

    import drove.torch as dt
except ImportError as e:  # the torch tests skip, saying why
    if os.environ.get("DROVE_REQUIRE_TORCH") == "1":
        raise  # scripts/python-package.sh's run on the Python that has torch
    torch = None
    WHY = "no torch here (%s): scripts/python-package.sh runs these on the Python that scripts/torch-tools.sh finds" % e
else:
    WHY = ""

import drove

FIXTURE = os.environ.get("DROVE_MASK_FIXTURE")
DROVE = os.environ.get("DROVE_BIN", "")


class Draws(torch.utils.data.Dataset if torch else object):
    """Each item: what the worker's random, NumPy and torch draw next, and which worker drew it."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        info = torch.utils.data.get_worker_info()
        return (random.random(), float(np.random.random()), float(torch.rand(())), info.id)


class FirstDraws(torch.utils.data.Dataset if torch else object):
    """Item w, loaded by worker w: its id, its loader's epoch seed, and its first draws."""

    def __len__(self):
        return 2

    def __getitem__(self, i):
        info = torch.utils.data.get_worker_info()
        assert info.id == i, "each of the two workers loads its own item"
        return (info.id, info.seed - info.id, random.random(), float(np.random.random()), float(torch.rand(())))


def draws(seeder, start_method, persistent=False, epochs=1):
    loader = torch.utils.data.DataLoader(
        Draws(), batch_size=None, num_workers=2, worker_init_fn=seeder,
        multiprocessing_context=start_method, persistent_workers=persistent)
    out = []
    for _ in range(epochs):
        out.append(sorted(tuple(x) for x in loader))
    return out


@unittest.skipIf(torch is None, WHY)
class WorkerSeeding(unittest.TestCase):
    def test_streams_differ_across_ranks_and_workers_and_repeat_run_to_run(self):
        for method in ("fork", "spawn"):
            with self.subTest(start_method=method):
                torch.manual_seed(42)
                rank0 = draws(dt.worker_init_fn(42, rank=0), method)[0]
                torch.manual_seed(42)
                again = draws(dt.worker_init_fn(42, rank=0), method)[0]
                torch.manual_seed(42)
                rank1 = draws(dt.worker_init_fn(42, rank=1), method)[0]
                self.assertEqual(rank0, again)
                values = [v for row in rank0 + rank1 for v in row[:3]]
                self.assertEqual(len(set(values)), len(values), "a draw repeats across ranks or workers")

    def test_without_it_every_rank_draws_the_same(self):
        # The story: the same torch seed on every rank, PyTorch's own worker seeding.
        torch.manual_seed(42)
        a = draws(None, "fork")[0]
        torch.manual_seed(42)
        b = draws(None, "fork")[0]
        self.assertEqual(a, b)

    def test_epochs_differ_and_persistent_workers_run_on(self):
        for persistent in (False, True):
            with self.subTest(persistent_workers=persistent):
                torch.manual_seed(42)
                first, second = draws(dt.worker_init_fn(42, rank=0), "fork", persistent, epochs=2)
                self.assertFalse(set(first) & set(second))

    @unittest.skipUnless(os.access(DROVE, os.X_OK), "DROVE_BIN names no drove binary (%r)" % DROVE)
    def test_a_worker_draws_what_drove_seed_gives_its_key(self):
        # The oracle is the Rust side: `drove seed` prints the outputs of the
        # key (seed, rank, worker, the loader's epoch seed); a worker seeded by
        # worker_init_fn must draw from random, NumPy and torch what those
        # outputs seed, whatever start method made it.
        for method in ("fork", "spawn"):
            with self.subTest(start_method=method):
                loader = torch.utils.data.DataLoader(
                    FirstDraws(), batch_size=None, num_workers=2, worker_init_fn=dt.worker_init_fn(42, rank=3),
                    multiprocessing_context=method)
                for worker, loader_seed, py, npy, th in loader:
                    out = subprocess.run(
                        [DROVE, "seed", "--json", "--purpose", "augment", "--seed", "42", "--rank", "3",
                         "--worker", str(worker), "--epoch", str(loader_seed % 2**64), "--count", "5"],
                        check=True, capture_output=True, text=True).stdout
                    o = [int(v, 16) for v in json.loads(out)["outputs"]]
                    self.assertEqual(py, random.Random(o[0] | (o[1] << 64)).random())
                    words = [w for v in o[2:4] for w in (v & 0xFFFFFFFF, v >> 32)]
                    self.assertEqual(npy, float(np.random.RandomState(words).random_sample()))
                    self.assertEqual(th, float(torch.rand((), generator=torch.Generator().manual_seed(o[4]))))

    def test_the_seeder_pickles_for_spawn(self):
        seeder = dt.worker_init_fn(42, rank=3)
        import pickle
        self.assertEqual(repr(pickle.loads(pickle.dumps(seeder))), "WorkerSeeder(seed=42, rank=3)")

    def test_bad_arguments_name_themselves(self):
        with self.assertRaisesRegex(ValueError, "seed must be in"):
            dt.worker_init_fn(-1, rank=0)
        with self.assertRaisesRegex(ValueError, "rank must be >= 0"):
            dt.worker_init_fn(1, rank=-2)


@unittest.skipIf(torch is None, WHY)
class Sampling(unittest.TestCase):
    @unittest.skipUnless(FIXTURE, "DROVE_MASK_FIXTURE names no fixture (scripts/python-package.sh writes one)")
    def test_the_sampler_gives_drove_collates_order(self):
        with open(FIXTURE) as f:
            cases = json.load(f)["samplers"]
        self.assertTrue(cases)
        for c in cases:
            with self.subTest(case=c):
                s = dt.DistributedSampler(range(c["len"]), num_replicas=c["world_size"], rank=c["rank"],
                                          seed=c["seed"], shuffle=c["shuffle"], drop_last=c["drop_last"])
                s.set_epoch(c["epoch"])
                self.assertEqual(list(s), c["indices"])
                self.assertEqual(len(s), len(c["indices"]))

    def test_shards_cover_the_epoch_and_epochs_differ(self):
        shards = [list(dt.DistributedSampler(range(12), num_replicas=3, rank=r, seed=5)) for r in range(3)]
        self.assertEqual(sorted(sum(shards, [])), list(range(12)))
        s = dt.DistributedSampler(range(12), num_replicas=3, rank=0, seed=5)
        s.set_epoch(1)
        self.assertNotEqual(list(s), shards[0])

    def test_a_rank_out_of_range_is_named(self):
        with self.assertRaisesRegex(ValueError, "rank: rank 3 is out of range for world size 3"):
            dt.DistributedSampler(range(12), num_replicas=3, rank=3)
        with self.assertRaisesRegex(ValueError, "world_size"):
            dt.DistributedSampler(range(12), num_replicas=0, rank=0)

    def test_masked_dataset_masks_a_sample_the_same_whatever_loads_it(self):
        rows = [{"input_ids": np.array([1] + list(range(10, 10 + n)) + [2]), "labels": np.zeros(n + 2)}
                for n in (5, 9, 14, 20, 7, 11)]
        masker = drove.Masker(mask_token=3, vocab_size=500, probability=0.3)
        data = dt.MaskedDataset(rows, masker, seed=9, special_tokens=(0, 1, 2), epoch=2)
        alone = [data[i] for i in range(len(rows))]
        for workers, method in ((0, None), (2, "fork"), (3, "spawn")):
            with self.subTest(workers=workers, start_method=method):
                loader = torch.utils.data.DataLoader(data, batch_size=None, num_workers=workers,
                                                     multiprocessing_context=method)
                for i, sample in enumerate(loader):
                    self.assertTrue(torch.equal(sample["input_ids"], alone[i]["input_ids"]))
                    self.assertTrue(torch.equal(sample["mask"], alone[i]["mask"]))
        ids = rows[3]["input_ids"]
        maskable = ~np.isin(ids, (0, 1, 2))
        expected, actions = masker.mask(ids[None], maskable[None], seed=9, epoch=2, samples=np.array([3]))
        self.assertEqual(alone[3]["input_ids"].tolist(), expected[0].tolist())
        self.assertEqual(alone[3]["mask"].tolist(), (actions[0] != 0).tolist())
        self.assertFalse(alone[3]["mask"][0] or alone[3]["mask"][-1], "a special token was chosen")


@unittest.skipIf(torch is None, WHY)
class Horovod(unittest.TestCase):
    def test_the_horovod_variant_gives_drove_torchs_report(self):
        from drove import _diagnostic
        import drove.horovod as dh

        from world import HorovodStandIn, ThreadWorld

        rng = np.random.default_rng(11)
        chosen = rng.random((4, 8, 32)) < 0.15
        maskable = rng.random((4, 8, 32)) < 0.9
        world = ThreadWorld(4)
        via_hvd = world.run(lambda r: dh.mask_agreement(
            torch.from_numpy(chosen[r]), torch.from_numpy(maskable[r]), probability=0.15, step=0,
            hvd=HorovodStandIn(world, r), metrics=False))
        world = ThreadWorld(4)
        via_core = world.run(lambda r: _diagnostic.mask_agreement(
            world.gather(r), r, 4, chosen[r], maskable[r], 0.15, 0, False))
        for a, b in zip(via_hvd, via_core):
            self.assertNotIsInstance(a, BaseException, a)
            self.assertEqual(a.to_dict(), b.to_dict())
        world = ThreadWorld(2)
        grads = [torch.tensor([1.0, 0.0]), torch.tensor([1.0, 1.0])]
        cos = world.run(lambda r: dh.grad_cosine(grads[r], step=0, hvd=HorovodStandIn(world, r), metrics=False))
        self.assertAlmostEqual(cos[0].mean, 2 ** -0.5)
        world = ThreadWorld(2)
        shapes = world.run(lambda r: dh.mask_agreement(
            torch.zeros((2 + r, 4), dtype=torch.bool), probability=0.15, step=0,
            hvd=HorovodStandIn(world, r), metrics=False))
        for e in shapes:
            self.assertIsInstance(e, dh.MaskShapeError)
            self.assertIn("rank(s) [1] have 3 rows x 4 positions", str(e))


@unittest.skipIf(torch is None, WHY)
class Alone(unittest.TestCase):
    def test_without_a_process_group_there_is_nothing_to_compare(self):
        self.assertIsNone(dt.mask_agreement(torch.zeros((2, 4), dtype=torch.bool), metrics=False))
        with self.assertRaisesRegex(ValueError, "passed a mask that is not 1-D or 2-D"):
            dt.mask_agreement(torch.zeros((2, 2, 4), dtype=torch.bool), metrics=False)
        with self.assertRaisesRegex(ValueError, "not boolean"):
            dt.mask_agreement(np.full((2, 4), 0.5), metrics=False)


if __name__ == "__main__":
    unittest.main()
