"""``source`` is a tagged union by kind (format 1.2): typed fields for the kinds writers use,
the 1.1 open record for any other, and every 1.1 source still readable."""

from __future__ import annotations

import copy

import pytest

from reproarchive.errors import SchemaViolation
from reproarchive.format import plain, schema
from reproarchive.format.schema_check import describe, required_bump

# keys as 1.1 writers of each kind wrote them (the dump and trace imports, the capture backend)
DUMP_1_1 = {"kind": "after_aot", "script": "repro.py", "run_repro": {"accuracy": "accuracy"}, "save_dir_found": True,
            "content_store": "recorded save_dir", "load_args_version": 1, "accuracy_mode": "accuracy",
            "inputs": [{"index": 0, "kind": "tensor"}], "storages": {"total": 1}, "lifted_module_state": [],
            "printed_module_state": [], "environment_origin": "e", "replay": {"performed": True},
            "torch_version": "2.13.0", "a_key_of_a_newer_writer": [1, 2]}
TRACE_1_1 = {"kind": "torch_trace", "compile_id": "0/0", "attempt": 0, "rank": None, "frame": {"name": "f"},
             "graph_kind": "after_dynamo", "graph_from": "dynamo_output_graph", "accuracy_from": None,
             "graph_breaks": ["x"], "metrics": {"guard_count": 3}}
CAPTURE_1_1 = {"kind": "capture", "stage": "crash", "fwd_only": False, "tolerance": None, "check_runtime": True,
               "written_before_run": True}


def _decode(raw):
    return plain.decode(schema.Records, {"source": copy.deepcopy(raw)}).source


@pytest.mark.parametrize("raw, cls, graph_kind", [
    (DUMP_1_1, schema.DumpSource, "after_aot"),
    (TRACE_1_1, schema.TraceSource, "after_dynamo"),
    (CAPTURE_1_1, schema.CaptureSource, None),
    ({"kind": "distributed", "graph_kind": "after_aot", "ranks": 8}, schema.SourceRecord, "after_aot"),
    ({"note": "no kind at all"}, schema.SourceRecord, None),
])
def test_each_kind_decodes_to_its_record(raw, cls, graph_kind):
    source = _decode(raw)
    assert type(source) is cls
    assert schema.Records(source=source).graph_kind == graph_kind
    again = plain.encode(source)
    # what a 1.1 writer wrote comes back, less the nils a 1.2 writer leaves out
    assert again == {k: v for k, v in raw.items() if v is not None}


def test_unknown_keys_are_kept():
    assert _decode(DUMP_1_1).extra == {"a_key_of_a_newer_writer": [1, 2]}
    assert _decode({"kind": "distributed", "ranks": 8}).extra == {"ranks": 8}


@pytest.mark.parametrize("raw, where", [
    ({**DUMP_1_1, "save_dir_found": "yes"}, "save_dir_found"),
    ({**TRACE_1_1, "attempt": "0"}, "attempt"),
    ({**CAPTURE_1_1, "stage": 3}, "stage"),
    ({"kind": 7}, "kind"),
])
def test_a_known_field_of_the_wrong_type_is_refused(raw, where):
    with pytest.raises(SchemaViolation) as info:
        _decode(raw)
    assert where in str(info.value.where)


def test_widening_a_record_into_a_union_with_it_as_fallback_is_a_minor_change():
    new = describe()
    old = copy.deepcopy(new)
    old["records"]["Index"]["fields"]["source"]["type"] = "SourceRecord|nil"
    for name in ("CaptureSource", "DumpSource", "TraceSource"):
        del old["records"][name]
    assert required_bump(old, new)[0] == "minor"
    other = copy.deepcopy(new)
    other["records"]["Index"]["fields"]["source"]["type"] = new["records"]["Index"]["fields"]["source"]["type"] \
        .replace("*=SourceRecord", "*=CaptureSource")
    assert required_bump(new, other)[0] == "major"
