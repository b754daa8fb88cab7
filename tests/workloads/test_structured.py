import json

import numpy as np

import workloads
from workloads.structured import json_schema, schema_size


def walk(schema):
    assert schema["type"] == "object" and set(schema["required"]) == set(schema["properties"])
    for child in schema["properties"].values():
        if child.get("type") == "object":
            walk(child)
        elif child.get("type") == "array":
            assert child["items"]["type"] in ("string", "integer")
        else:
            assert child.get("type") in ("string", "integer", "number", "boolean")


def test_schemas_are_valid_objects_of_the_requested_size():
    rng = np.random.default_rng(0)
    for fields in (1, 4, 16, 64):
        schema = json_schema(fields, rng)
        walk(schema)
        assert len(schema["properties"]) == fields and schema_size(schema) >= fields
        assert json.loads(json.dumps(schema)) == schema


def test_structured_workload_varies_schema_size():
    specs = workloads.load("structured", num_requests=200, seed=0)
    sizes = {len(s.schema["properties"]) for s in specs}
    assert sizes == {1, 4, 16, 64}
    assert len({json.dumps(s.schema) for s in specs}) > 150
