"""The differential conformance suite's index: every line of the project's
checklist of stock's behaviour (docs/http-backend-checklist.md), by its id,
mapped to the tests that cover it. The tests themselves live in
tests/test_conformance_*.py:

  request   method, paths, alias check, routing, repository discovery, export, getanyfile
  dumb      HEAD, text info/refs, objects/info/*, loose/pack/idx, exact header blocks, dates
  smart     advertisements, services, query strings, POST checks, bodies, gzip, buffer limits, deviations
  protocol  negotiation, shallow/filter, v2 commands, GIT_PROTOCOL, namespaces, config, child failures
  receive   committer identity, hook environment and output, receive.* config, non-bare repositories
  clients   real git clients against stock (CGI), aspen-cgi (CGI) and aspen (gunicorn/WSGI)

The check below fails when a checklist line has no test, or names a test that does not exist."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

CHECKLIST = Path(__file__).resolve().parent.parent / "docs" / "http-backend-checklist.md"

COVERAGE: dict[str, list[str]] = {
    "no-method": ["request:test_missing_request_method_is_500_with_nocache"],
    "head-is-get": ["request:test_head_method_is_treated_as_get_and_still_has_a_body",
                    "request:test_head_method_on_post_route_is_405_allow_post",
                    "request:test_method_comparison_is_case_sensitive"],
    "root-no-path": ["request:test_project_root_with_empty_or_unset_path_info_is_500"],
    "root-aliased": ["request:test_project_root_mode_rejects_aliased_paths_with_500",
                     "request:test_tilde_path_is_not_aliased"],
    "three-dots": ["request:test_three_dot_segments_allowed_and_path_translated_not_alias_checked"],
    "no-root": ["request:test_neither_project_root_nor_path_translated_is_500",
                "request:test_empty_project_root_falls_back_to_path_translated"],
    "root-join": ["request:test_root_without_trailing_slash_is_joined_with_one_slash"],
    "route-match": ["request:test_route_regexes_match_full_path_anchored_at_end_first_match_case_sensitive",
                    "request:test_route_matching_newline_in_path_is_not_end"],
    "hash-lengths": ["request:test_pack_names_40_and_64_hex_and_loose_objects_2_38_and_2_62_are_routed"],
    "unknown-path": ["request:test_unknown_path_is_404_nocache_empty_body_with_request_not_supported"],
    "wrong-method": ["request:test_wrong_method_is_405_with_allow_on_http11_else_400",
                     "request:test_wrong_method_without_server_protocol_is_400"],
    "method-first": ["request:test_method_check_happens_before_repository_export_and_service_checks"],
    "not-a-repo": ["request:test_not_a_repository_is_404_with_message",
                   "request:test_plain_directory_is_not_a_repository"],
    "dwim-suffixes": ["request:test_dwim_suffixes_tried_in_order_and_trailing_slashes_stripped"],
    "gitfile": ["request:test_gitfile_is_followed"],
    "dubious-owner": ["request:test_repository_with_dubious_ownership_is_500_unless_safe_directory"],
    "not-exported": ["request:test_not_exported_is_404_unless_export_ok_or_export_all_even_empty",
                     "request:test_not_exported_message_names_the_requested_path_not_the_dwim_one"],
    "getanyfile": ["request:test_getanyfile_false_is_403_on_dumb_routes_and_smart_unaffected"],
    "dumb-head": ["dumb:test_get_head_is_text_plain_with_length_no_cache_headers_symref_hex_or_empty",
                  "dumb:test_get_head_symref_to_tag_and_nested_symref"],
    "dumb-info-refs": ["dumb:test_dumb_info_refs_is_text_plain_nocache_length_with_peeled_tags_no_head",
                       "dumb:test_dumb_info_refs_of_empty_repository_is_empty"],
    "dumb-refs-filter": ["dumb:test_dumb_info_refs_honours_namespaces_ignores_hiderefs_skips_missing_objects"],
    "info-packs": ["dumb:test_objects_info_packs_generated_from_local_packs_with_final_newline",
                   "dumb:test_objects_info_packs_order_with_equal_mtimes_matches_stock",
                   "dumb:test_objects_info_packs_without_packs_is_single_newline"],
    "alternates": ["dumb:test_objects_info_alternates_text_plain_nocache_length_last_modified"],
    "alternates-missing": ["dumb:test_missing_alternates_is_404_with_duplicated_nocache_block"],
    "object-files": ["dumb:test_loose_pack_and_idx_have_types_cache_forever_length_last_modified",
                     "dumb:test_unreadable_object_file_never_gets_a_second_header_block"],
    "object-missing": ["dumb:test_missing_loose_pack_or_idx_is_404_preceded_by_cache_forever_headers"],
    "no-cache-block": ["dumb:test_exact_nocache_header_values_and_order"],
    "cache-forever": ["dumb:test_exact_cache_forever_values_expires_is_date_plus_one_year"],
    "dates": ["dumb:test_dates_are_rfc2822_numeric_zone_day_not_zero_padded"],
    "header-form": ["dumb:test_crlf_line_endings_status_omitted_on_200_content_type_last_for_smart"],
    "advert-upload": ["smart:test_info_refs_upload_pack_is_200_advertisement_nocache_no_content_length_streamed"],
    "advert-prefix": ["smart:test_v0_advertisement_starts_with_service_line_and_flush",
                      "smart:test_v0_advertisement_of_empty_repository"],
    "advert-v1": ["smart:test_v1_adds_version_1_after_the_flush"],
    "advert-v2": ["smart:test_v2_omits_service_prefix_and_returns_version_2_capabilities",
                  "smart:test_unknown_protocol_versions_fall_back_to_v0"],
    "receive-v2": ["smart:test_receive_pack_with_version_2_is_v0_advertisement_without_service_prefix"],
    "bad-service": ["smart:test_service_not_starting_with_git_or_unknown_is_403_unsupported_service"],
    "service-disabled": ["smart:test_disabled_service_is_403_service_not_enabled"],
    "forbidden-twice": ["smart:test_403_on_info_refs_carries_the_nocache_block_twice"],
    "query-string": ["smart:test_query_string_parsing_matches_stock"],
    "receive-enabled": ["smart:test_receive_pack_enabled_iff_config_true_or_unset_with_remote_user"],
    "upload-enabled": ["smart:test_upload_pack_enabled_unless_config_false"],
    "upload-archive": ["smart:test_upload_archive_route_absent_in_2_39_reference"],
    "post-order": ["smart:test_post_service_check_403_comes_before_content_type_check_415"],
    "post-415": ["smart:test_415_has_no_content_type_and_expected_body"],
    "content-type-exact": ["smart:test_content_type_compared_exactly_and_unset_is_empty"],
    "post-result": ["smart:test_post_response_is_result_type_nocache_streamed_no_content_length"],
    "flush-only": ["smart:test_post_flush_only_body_gives_200_with_zero_byte_body"],
    "empty-errors": ["smart:test_403_and_404_bodies_are_zero_bytes",
                     "clients:test_passes_t5560_t5561_access_matrix_partial"],
    "content-length": ["smart:test_content_length_honoured_reads_exactly_n_bytes_and_never_waits_for_eof",
                       "smart:test_content_length_is_parsed_like_git_parse_ssize_t"],
    "chunked": ["smart:test_unset_or_empty_content_length_reads_body_to_eof"],
    "bad-length": ["smart:test_unparsable_or_overflowing_content_length_is_400_with_fatal_message"],
    "gzip": ["smart:test_gzip_and_x_gzip_request_bodies_are_inflated",
             "smart:test_gzip_receive_pack_flush_is_inflated"],
    "gzip-truncated": ["smart:test_truncated_gzip_upload_pack_request_fails",
                       "smart:test_truncated_gzip_receive_pack_request_fails_with_fatal_and_no_traceback"],
    "other-encodings": ["smart:test_other_content_encodings_are_passed_through_raw"],
    "truncated-body": ["smart:test_truncated_or_empty_plain_upload_pack_bodies_fail_with_fatal",
                       "smart:test_truncated_or_empty_plain_receive_pack_bodies_fail_with_fatal"],
    "request-buffer": ["smart:test_upload_pack_request_over_buffer_limit_is_413",
                       "smart:test_default_request_buffer_is_10_mib",
                       "smart:test_bad_max_request_buffer_dies_500_before_headers"],
    "receive-streamed": ["smart:test_receive_pack_body_is_streamed_with_no_size_limit"],
    "short-body": ["smart:test_short_body_with_content_length_set_does_not_hang"],
    "child-args": ["receive:test_full_cgi_environment_passed_to_children_and_hooks_run_in_git_dir",
                   "smart:test_v0_advertisement_starts_with_service_line_and_flush"],
    "child-stderr": ["protocol:test_child_stderr_forwarded_to_server_log",
                     "protocol:test_child_killed_if_the_backend_goes_away"],
    "committer": ["receive:test_committer_identity_defaults_to_remote_user_or_anonymous_and_preset_values_win"],
    "git-protocol": ["protocol:test_http_git_protocol_copied_to_git_protocol_only_if_absent"],
    "namespace": ["protocol:test_git_namespace_honoured_smart_and_dumb"],
    "cgi-environment": ["receive:test_full_cgi_environment_passed_to_children_and_hooks_run_in_git_dir"],
    "hook-output": ["receive:test_hook_output_reaches_client_as_sideband_2_remote_lines",
                    "receive:test_rejecting_pre_receive_hook_reports_ng_and_keeps_refs",
                    "clients:test_push_hook_output_as_remote_lines_and_reflog_identity_real_client"],
    "repo-config": ["receive:test_receive_pack_repo_config_takes_effect_deny_and_fsck",
                    "receive:test_receive_pack_advertisement_config_hiderefs_push_options_atomic",
                    "protocol:test_upload_pack_repo_config_hiderefs_allow_sha1_in_want_filter_advertise",
                    "protocol:test_filter_without_allow_filter_is_refused_like_stock"],
    "stateless-rounds": ["protocol:test_stateless_negotiation_across_posts_multi_ack_detailed_no_done_ack_ready_with_pack",
                         "protocol:test_stateless_negotiation_ack_ready_and_pack_in_one_response_with_no_done",
                         "protocol:test_wants_reachable_but_not_advertised_are_allowed_over_http",
                         "clients:test_incremental_fetch_negotiates_over_several_posts"],
    "shallow-filter": ["protocol:test_shallow_deepen_since_deepen_not_and_filter_fetches",
                       "clients:test_shallow_deepen_and_filter_clones_over_http"],
    "v2-commands": ["protocol:test_v2_ls_refs_variants",
                    "protocol:test_v2_fetch_including_wait_for_done_and_packfile_uris",
                    "protocol:test_v2_object_info_and_empty_request_one_command_per_post",
                    "protocol:test_v2_unknown_command_and_bad_args"],
    "large-bodies": ["clients:test_large_chunked_upload_pack_request_with_probe_post",
                     "clients:test_gzip_encoded_upload_pack_requests_from_a_real_client",
                     "clients:test_large_chunked_receive_pack_request_with_probe_post"],
    "non-bare": ["receive:test_non_bare_repository_served_and_deny_current_branch_applied",
                 "request:test_dwim_suffixes_tried_in_order_and_trailing_slashes_stripped"],
    "late-errors": ["protocol:test_errors_after_headers_leave_200_truncated_body_never_second_status"],
    "early-errors": ["smart:test_die_before_headers_is_500_nocache_empty_body_with_fatal",
                     "smart:test_internal_error_is_500_with_empty_body_and_traceback_only_in_the_log"],
    "git-test-scripts": ["clients:test_passes_t5560_t5561_access_matrix_partial",
                         "clients:test_dumb_http_clone_works_against_both"],
}


def _checklist() -> list[str]:
    """The ids of the checklist's lines, in order."""
    return re.findall(r"^- `([a-z0-9-]+)` ", CHECKLIST.read_text(encoding="utf-8"), re.M)


def test_every_checklist_line_is_covered_by_existing_tests():
    lines = _checklist()
    assert len(lines) >= 70 and len(set(lines)) == len(lines)
    unmapped = [line for line in lines if line not in COVERAGE]
    assert not unmapped, f"checklist lines without a test: {unmapped}"
    unused = [key for key in COVERAGE if key not in lines]
    assert not unused, f"coverage keys that match no checklist line: {unused}"
    missing = []
    for names in COVERAGE.values():
        for ref in names:
            module, name = ref.split(":")
            mod = importlib.import_module(f"tests.test_conformance_{module}")
            if not callable(getattr(mod, name, None)):
                missing.append(ref)
    assert not missing, f"tests named in the coverage map that do not exist: {missing}"
