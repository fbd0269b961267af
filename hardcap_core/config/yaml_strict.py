"""The YAML loader for config files: PyYAML's SafeLoader, refusing duplicate keys.

Its own module so that ``yaml`` is imported only when a config is parsed, not on a cold start
that loads the build's validated copy (:mod:`hardcap_core.config.loader`).
"""

from __future__ import annotations

from typing import Any

import yaml


class StrictLoader(yaml.SafeLoader):
    """A SafeLoader that refuses duplicate keys, which plain YAML resolves by keeping the last."""


def _mapping_without_duplicates(loader: yaml.SafeLoader, node: yaml.MappingNode) -> Any:
    seen: set[object] = set()
    for key_node, _ in node.value:
        # Only plain keys: `<<` merges and complex keys are construct_mapping's business.
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
            continue
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node)


StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates
)
