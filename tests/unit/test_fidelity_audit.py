"""Every divergence of the fidelity audit (shared/reference/fidelity-audit-2026-11-26.md, D1-D20)
is a named test: the map below names, for each item, the tests that check the server's behaviour
for it, and a test asserts that each of them exists. D11, which no other module checks, is in
tests/integration/test_fidelity_audit.py."""

from __future__ import annotations

import importlib
from typing import Any

import pytest

LAYERS = ("unit", "component", "integration")

# Each audit item: the tests ("module::function", or "module::function[id-prefix]" for one
# parametrization) that check it.
AUDIT_TESTS: dict[str, tuple[str, ...]] = {
    "D1": ("test_reference_fidelity::test_d1_view_collmod_is_a_modify_event",),
    "D1b": (
        "test_simcluster_fidelity::test_d1b_view_coll_mod_is_a_replacement_of_its_system_views_document",
    ),
    "D2": (
        "test_reference_fidelity::test_d2_d3_view_event_token_has_system_views_uuid_and_whole_document",
    ),
    "D3": (
        "test_reference_fidelity::test_d2_d3_view_event_token_has_system_views_uuid_and_whole_document",
    ),
    "D4": ("test_reference_fidelity::test_d4_system_collections_make_no_ddl_events",),
    "D5": (
        "test_reference_fidelity::test_d5_reshard_and_refine_noops_are_events",
        "test_simcluster_fidelity::test_refine_and_reshard_collection_log_their_noops",
    ),
    "D6a": ("test_reference_fidelity::test_d6a_create_and_create_indexes_inside_a_transaction",),
    "D6b": ("test_simcluster_fidelity::test_d6b_ddl_inside_a_transaction_is_in_its_apply_ops",),
    "D7": ("test_reference_streams::test_d7_single_collection_stream_sees_no_view_events",),
    "D8": (
        "test_reference_streams::test_d8_start_after_invalidate_skips_drop_database",
        "test_reference_streams::test_d8_drop_database_does_not_end_a_stream_on_a_collection_it_did_not_hold",
    ),
    "D9": (
        "test_reference_streams::test_d9_resume_from_a_v1_event_token",
        "test_reference_streams::test_d9_resume_from_a_v1_high_water_mark_keeps_v1_at_its_time",
    ),
    "D10": (
        "test_reference_fidelity::test_d10_array_index_not_ambiguous",
        "test_reference_fidelity::test_d10_leading_numeric_field_not_ambiguous",
        "test_reference_fidelity::test_d10_numeric_field_below_the_top_is_ambiguous",
        "test_reference_fidelity::test_d10_order_updates_inserts_deletes_then_subdiffs",
        "test_reference_fidelity::test_d10_fast_path_orders_updates_before_inserts",
    ),
    "D11": ("test_fidelity_audit::test_d11_full_document_before_change_is_the_last_field",),
    "D12": ("test_simcluster_fidelity::test_d12_a_sharded_drop_is_one_visible_drop",),
    "D13": (
        "test_simcluster_fidelity::test_d13_index_build_on_a_non_empty_collection_is_one_commit",
    ),
    "D14a": (
        "test_simcluster_fidelity::test_d14_shard_collection_creates_the_key_index_and_logs_its_options",
    ),
    "D14b": (
        "test_simcluster_fidelity::test_d14_shard_collection_creates_the_key_index_and_logs_its_options",
    ),
    "D15": ("test_simcluster_fidelity::test_d15_state_before_change_starts_with_the_uuid",),
    "D16": ("test_simcluster_fidelity::test_d16_create_options_as_the_catalog_stores_them",),
    "D17": ("test_simcluster_fidelity::test_d17_index_specs_in_the_catalog_order",),
    "D18": (
        "test_simcluster_fidelity::test_d18_a_time_series_collection_is_a_view_on_its_buckets",
    ),
    "D19a": (
        "test_reference_streams::test_d19_change_stream_spec_errors_as_the_idl_gives_them[d19a]",
    ),
    "D19b": (
        "test_reference_streams::test_d19_change_stream_spec_errors_as_the_idl_gives_them[d19b]",
    ),
    "D19c": (
        "test_reference_streams::test_d19_change_stream_spec_errors_as_the_idl_gives_them[d19c]",
    ),
    "D19d": (
        "test_reference_streams::test_d19_change_stream_spec_errors_as_the_idl_gives_them[d19d]",
    ),
    "D19e": (
        "test_reference_streams::test_d19_change_stream_spec_errors_as_the_idl_gives_them[d19e]",
    ),
    "D19f": (
        "test_reference_streams::test_d19_change_stream_spec_errors_as_the_idl_gives_them[d19f]",
        "test_reference_streams::test_d19f_missing_required_image_names_the_event",
    ),
    "D19g": (
        "test_simcluster_fidelity::test_d19g_history_lost_at_open_carries_the_non_resumable_label",
    ),
    "D20": ("test_reference_streams::test_d20_replies_the_proxy_makes_carry_the_cluster_time",),
}

# The audit's items as its section 1 lists them.
AUDIT_ITEMS = (
    "D1",
    "D1b",
    "D2",
    "D3",
    "D4",
    "D5",
    "D6a",
    "D6b",
    "D7",
    "D8",
    "D9",
    "D10",
    "D11",
    "D12",
    "D13",
    "D14a",
    "D14b",
    "D15",
    "D16",
    "D17",
    "D18",
    "D19a",
    "D19b",
    "D19c",
    "D19d",
    "D19e",
    "D19f",
    "D19g",
    "D20",
)


def _param_ids(function: Any) -> list[str]:
    """The ids of a parametrized test's cases."""
    ids: list[str] = []
    for mark in getattr(function, "pytestmark", []):
        if mark.name == "parametrize":
            ids += [p.id for p in mark.args[1] if getattr(p, "id", None)]
    return ids


def _test_function(module_name: str, function_name: str) -> Any:
    """The test `function_name` of the test module `module_name` in whichever layer holds it:
    the map names tests, not the layer (unit, component, integration) they live in."""
    for layer in LAYERS:
        try:
            module = importlib.import_module(f"tests.{layer}.{module_name}")
        except ModuleNotFoundError:
            continue
        if (function := getattr(module, function_name, None)) is not None:
            return function
    return None


@pytest.mark.parametrize("item", AUDIT_ITEMS)
def test_every_audit_item_names_its_tests(item: str) -> None:
    assert set(AUDIT_TESTS) == set(AUDIT_ITEMS)
    for name in AUDIT_TESTS[item]:
        module_name, _, test = name.partition("::")
        function_name, _, param = test.partition("[")
        function = _test_function(module_name, function_name)
        assert callable(function), f"{item}: no test {name}"
        if param:
            prefix = param.rstrip("]")
            assert any(i.startswith(prefix) for i in _param_ids(function)), (
                f"{item}: no case {name}"
            )
