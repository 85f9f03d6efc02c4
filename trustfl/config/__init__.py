"""Experiment configuration: TOML → validated typed objects (schema, load) → runnable objects (build)."""
from trustfl.config.load import load_config, parse_override, config_from_dict, dump_toml
from trustfl.config.schema import ExperimentConfig

__all__ = ["ExperimentConfig", "config_from_dict", "dump_toml", "load_config", "parse_override"]
