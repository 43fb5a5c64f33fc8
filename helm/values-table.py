"""Prints the chart README's values table from values.schema.json (meanings) and
values.yaml (defaults). helm/ci.sh fails when the README's table differs from it."""
import json
import sys

import yaml

chart = sys.argv[1] if len(sys.argv) > 1 else "helm/spark-pod-allocator"
schema = json.load(open(f"{chart}/values.schema.json"))
values = yaml.safe_load(open(f"{chart}/values.yaml"))
rows = ["| value | default | meaning |", "|---|---|---|"]


def walk(node, value, path):
    properties = node.get("properties")
    if properties and node.get("additionalProperties") is False:
        for key, sub in properties.items():
            if key == "global":
                continue
            inner = value.get(key) if isinstance(value, dict) else None
            walk(sub, inner, path + [key])
        return
    default = f'"{value}"' if isinstance(value, str) else json.dumps(value)
    rows.append(f"| `{'.'.join(path)}` | `{default}` | {node.get('description', '')} |")


walk(schema, values, [])
print("\n".join(rows))
