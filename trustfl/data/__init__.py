"""Data: data sets as tensors, horizontal partitioners, client batch samplers and vertical feature splits.

Registered names: ``dataset`` (digits, breast_cancer, diabetes, mnist, fashion_mnist, fedprox_synthetic, synthetic
(``population.py``: clients generated on demand), and your own files: npz, csv, parquet, image_folder — ``own.py``,
``own_tables.py``, ``own_images.py``, docs/data.md),
``partitioner`` (iid, dirichlet, shards, quantity_skew, class_groups, natural) and ``batch_sampler`` (shuffle,
fixed, poisson).
"""
from trustfl.data.datasets import Dataset, dataset_available, load_dataset, resolve_data_dir
from trustfl.data.idx import array_sha256, read_idx, write_idx
from trustfl.data.partition import IID, AbstractPartitioner, Dirichlet, Partition, QuantitySkew, Shards
from trustfl.data.sampling import AbstractBatchSampler, FixedSizeSampler, PoissonSampler, ShuffleSampler
from trustfl.data.vertical import split_features

__all__ = [
    "IID",
    "AbstractBatchSampler",
    "AbstractPartitioner",
    "Dataset",
    "Dirichlet",
    "FixedSizeSampler",
    "Partition",
    "PoissonSampler",
    "QuantitySkew",
    "Shards",
    "ShuffleSampler",
    "array_sha256",
    "dataset_available",
    "load_dataset",
    "read_idx",
    "resolve_data_dir",
    "split_features",
    "write_idx",
]
