"""The run configuration: typed schema (schema.py), loading and checking (load.py), errors (errors.py)."""
from fl.config.arms import ARM, ARMS, arm_overrides, expand_arms
from fl.config.errors import ConfigError
from fl.config.load import (
                              CONF_DIR,
                              DEFAULT_CONF,
                              MOVED_KEYS,
                              RESUMABLE_KEYS,
                              available_confs,
                              choices_msg,
                              config_diff,
                              load_conf_file,
                              load_config,
                              parse_argv,
                              resolve_conf_path,
                              to_yaml,
                              validate,
)
from fl.config.schema import (
                              ClientTransformConfig,
                              Config,
                              DataConfig,
                              MethodConfig,
                              PartitionConfig,
                              TargetConfig,
                              param,
                              search_spaces,
)

__all__ = ["ARM", "ARMS", "arm_overrides", "expand_arms", "ConfigError", "ClientTransformConfig", "Config",
           "DataConfig", "MethodConfig", "PartitionConfig", "TargetConfig", "param", "search_spaces", "CONF_DIR",
           "DEFAULT_CONF", "MOVED_KEYS", "RESUMABLE_KEYS", "available_confs", "choices_msg", "config_diff",
           "load_conf_file", "load_config", "parse_argv", "resolve_conf_path", "to_yaml", "validate"]
