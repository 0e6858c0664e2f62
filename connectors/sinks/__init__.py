"""Sinks: Arrow tables and merge plans in; idempotent Delta commits (delta_rs) and CDM manifest
documents (cdm_manifest) out.
"""
