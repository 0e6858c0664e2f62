"""The OpenAPI 3.1 document of the daemon's HTTP API, served at /openapi.json and kept in docs/openapi.json."""

from __future__ import annotations

from typing import Any

from lakefeed.intake.records import CONTENT_TYPES

_ERROR = {"type": "object", "required": ["error"], "properties": {
    "error": {"type": "string"},
    "problems": {"type": "array", "items": {"type": "object", "properties": {
        "row": {"type": ["integer", "null"], "description": "1-based record number"},
        "field": {"type": ["string", "null"]},
        "message": {"type": "string"}}}},
    "problems_total": {"type": "integer"}}}


def _error(description: str, retry_after: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"description": description,
                           "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    if retry_after:
        out["headers"] = {"Retry-After": {"schema": {"type": "integer"}, "description": "seconds"}}
    return out


def _body_schema(kind: str) -> dict[str, Any]:
    if kind == "json":
        return {"type": "array", "items": {"type": "object"}}
    if kind == "ndjson" or kind == "csv":
        return {"type": "string"}
    return {"type": "string", "format": "binary"}


def document() -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {"title": "lakefeed", "version": "1", "description":
                 "Push records into a lakefeed entity, S3 event notifications, health of the daemon, "
                 "compaction on demand. "
                 "See docs/push-api.md and docs/s3.md."},
        "paths": {
            "/v1/entities/{entity}/sources/{source}/records": {"post": {
                "summary": "Push records to an entity's push source",
                "description": "202 is sent only after the records are durably in the source's spool (fsynced). "
                               "Nothing of a rejected request is stored.",
                "security": [{"bearer": []}],
                "parameters": [
                    {"name": "entity", "in": "path", "required": True, "schema": {"type": "string"}},
                    {"name": "source", "in": "path", "required": True, "schema": {"type": "string"}},
                    {"name": "Idempotency-Key", "in": "header", "required": False,
                     "schema": {"type": "string", "minLength": 1, "maxLength": 256},
                     "description": "UTF-8 text. A retry with the same key is acknowledged again, stored once."},
                    {"name": "Event-Time", "in": "header", "required": False,
                     "schema": {"type": "string", "format": "date-time"},
                     "description": "Event time of every record (when event_time.source is system)."},
                ],
                "requestBody": {"required": True, "content": {
                    media: {"schema": _body_schema(kind)} for media, kind in CONTENT_TYPES.items()}},
                "responses": {
                    "202": {"description": "Durably accepted", "content": {"application/json": {"schema": {
                        "$ref": "#/components/schemas/Accepted"}}}},
                    "400": _error("Invalid records or headers; problems list rows and fields"),
                    "401": _error("No or invalid bearer token"),
                    "403": _error("The token belongs to another source"),
                    "404": _error("Unknown entity or source"),
                    "413": _error("Body larger than http.max_body_bytes, also once inflated (Content-Encoding "
                                  "gzip or deflate); a Parquet or Arrow body decoding to more than 8 times it"),
                    "415": _error("Unsupported Content-Type"),
                    "429": _error("Rate limit of the source exceeded", retry_after=True),
                    "503": _error("Spool full (ingestion behind), daemon starting or stopping, or the spool could "
                                  "not write: nothing stored, send again", retry_after=True),
                    "507": _error("The spool's disk is full: nothing stored, send again", retry_after=True),
                }}},
            "/v1/entities/{entity}/notifications": {"post": {
                "summary": "S3 event notifications for an entity whose source is a bucket (SNS, MinIO webhook)",
                "description": "Bodies: an AWS `Records` document, MinIO's `{EventName, Key, Records}`, an SNS "
                               "Notification or SubscriptionConfirmation envelope. 200 is sent only after the "
                               "events are durably in the entity's inbox; rejected records are set aside with "
                               "their reason (state folder, poison.jsonl) and still answered 200. See docs/s3.md.",
                "security": [{"bearer": []}, {"basic": []}, {"token": []}],
                "parameters": [
                    {"name": "entity", "in": "path", "required": True, "schema": {"type": "string"}}],
                "requestBody": {"required": True, "content": {
                    "text/plain": {"schema": {"type": "string"}}, "application/json": {"schema": {
                        "type": "object"}}}},
                "responses": {
                    "200": {"description": "Stored (or confirmed)", "content": {"application/json": {"schema": {
                        "$ref": "#/components/schemas/Notified"}}}},
                    "401": _error("No or invalid token"),
                    "403": _error("A subscription confirmation for a topic not in notifications.topic_arns"),
                    "404": _error("The entity takes no webhook notifications"),
                    "503": _error("Not stored (object store or inbox failed): send again", retry_after=True),
                }}},
            "/healthz": {"get": {"summary": "The process is alive", "responses": {
                "200": {"description": "alive"}}}},
            "/readyz": {"get": {"summary": "Every stream is running", "responses": {
                "200": {"description": "ready"}, "503": {"description": "a stream is not running"}}}},
            "/compact": {
                "post": {"summary": "Compact and vacuum entities' tables now, due or not (`lakefeed compact`)",
                         "description": "Answered at once; each entity is compacted between its batches, and GET "
                                        "/compact says when. The token is in the daemon's "
                                        "state_dir/admin.token.",
                         "security": [{"bearer": []}],
                         "requestBody": {"required": False, "content": {"application/json": {"schema": {
                             "type": "object", "properties": {"entities": {
                                 "type": "array", "items": {"type": "string"},
                                 "description": "default: every entity"}}}}}},
                         "responses": {
                             "202": {"description": "Started (or joined, for an entity whose run goes on): each "
                                                    "entity's run number", "content": {"application/json": {
                                                        "schema": {"$ref": "#/components/schemas/Runs"}}}},
                             "400": _error("The body is not {\"entities\": [names]}"),
                             "401": _error("No or invalid bearer token"),
                             "404": _error("An entity the daemon does not run"),
                             "409": _error("An entity named is starting, stopping or failed"),
                             "503": _error("The daemon is stopping", retry_after=True)}},
                "get": {"summary": "Each entity's latest compaction run: state (running, done, failed) and what "
                                   "became of each table", "responses": {"200": {"description": "runs"}}}},
            "/openapi.json": {"get": {"summary": "This document", "responses": {"200": {"description": "OpenAPI"}}}},
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"},
                                "basic": {"type": "http", "scheme": "basic", "description": "the token as password"},
                                "token": {"type": "apiKey", "in": "query", "name": "token"}},
            "schemas": {
                "Error": _ERROR,
                "Accepted": {"type": "object", "required": ["entity", "source", "batch", "records"], "properties": {
                    "entity": {"type": "string"}, "source": {"type": "string"},
                    "batch": {"type": "integer", "description": "the spool offset assigned to the request"},
                    "records": {"type": "integer"}, "received_at": {"type": "string", "format": "date-time"},
                    "duplicate": {"type": "boolean", "description": "an Idempotency-Key seen before"}}},
                "Runs": {"type": "object", "required": ["runs"], "properties": {
                    "runs": {"type": "object", "additionalProperties": {"type": "integer"}},
                    "not_running": {"type": "array", "items": {"type": "string"}, "description":
                                    "entities left out of a request for every entity: starting, stopping or "
                                    "failed"}}},
                "Notified": {"type": "object", "properties": {
                    "events": {"type": "integer"}, "enqueued": {"type": "integer", "description": "new to the inbox"},
                    "rejected": {"type": "integer"}, "ignored": {"type": "integer"},
                    "confirmed": {"type": "string", "description": "the SNS topic whose subscription was confirmed"}}},
            },
        },
    }
