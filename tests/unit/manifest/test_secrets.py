"""No credential in a manifest: avsim.manifest.secrets finds credential shapes, masks them, and the
validator refuses them at their path with a message that points to Airflow connections."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from avsim.errors import ManifestError
from avsim.manifest.loader import parse_manifest_text
from avsim.manifest.sample import sample_manifest
from avsim.manifest.secrets import (
    MASK,
    USE_A_CONNECTION,
    find_secrets,
    is_sensitive_key,
    mask_secrets,
    secret_problems,
)
from avsim.manifest.validation import validate_manifest

ROOT = Path(__file__).resolve().parents[3]

#: (text, the kind found, how the finding shows it, the secret part that must never be shown)
SHAPES = [
    ("AKIAIOSFODNN7EXAMPLE", "an AWS access key id", "AKIA****", "IOSFODNN7EXAMPLE"),
    ("id ASIAY34FZKBOKMUTVV7A in text", "an AWS access key id", "ASIA****", "Y34FZKBOKMUTVV7A"),
    (
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7bq0\n-----END RSA PRIVATE KEY-----",
        "a private key",
        "-----BEGIN RSA PRIVATE KEY-----****",
        "MIIEowIBAAKCAQEA7bq0",
    ),
    ("-----BEGIN OPENSSH PRIVATE KEY-----b3BlbnNzaC1rZXk", "a private key", None, "b3BlbnNzaC1rZXk"),
    ("s3://user:hunter2x@bucket/key", "a password in a URI", "s3://user:****@", "hunter2x"),
    ("redis://:s3cr3tpw@cache:6379/0", "a password in a URI", "redis://:****@", "s3cr3tpw"),
    (
        "postgresql://avsim:p%40ss:w0rd@db/avsim",
        "a password in a URI",
        "postgresql://avsim:****@",
        "p%40ss:w0rd",
    ),
    ("https://h/x?user=a&password=hunter2x", "a credential in a URI query", "&password=****", "hunter2x"),
    (
        "https://b.s3.amazonaws.com/k?X-Amz-Signature=fe5f80f77d5fa3be",
        "a credential in a URI query",
        None,
        "fe5f80f7",
    ),
    (
        "https://acct.blob.core.windows.net/c/b?sv=2022&sig=Zm9vYmFyYmF6cXV4",
        "a credential in a URI query",
        None,
        "Zm9vYmFy",
    ),
    (
        "Authorization: Bearer abcdef0123456789xyz",
        "a bearer or basic credential",
        "Bearer ****",
        "abcdef0123",
    ),
    ("Basic YWxhZGRpbjpvcGVuc2VzYW1l", "a bearer or basic credential", "Basic ****", "YWxhZGRpbjpv"),
    (
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        "a JSON web token",
        "eyJ****",
        "dozjgNryP4J3",
    ),
    ("--password=hunter2x", "an assigned credential", "password=****", "hunter2x"),
    ("aws_secret_access_key = wJalrXUtnFEMI/K7MDENG", "an assigned credential", None, "wJalrXUtnFEMI"),
    (
        "AccountName=a;AccountKey=bXlrZXlteWtleQ==;Suffix=x",
        "an assigned credential",
        "AccountKey=****",
        "bXlrZXlt",
    ),
    ("ghp_" + "a1B2" * 9, "an API token", "ghp_****", "a1B2a1B2"),
    (
        "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuv",
        "an API token",
        "github_pat_****",
        "11ABCDEFG0",
    ),
    ("glpat-abcdefghij0123456789", "an API token", "glpat-****", "abcdefghij01"),
    ("xoxb-123456789012-abcdefABCDEF", "an API token", "xoxb-****", "123456789012"),
    ("AIza" + "Sy" + "B" * 33, "an API token", "AIza****", "SyBBBB"),
    ("sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc", "an API token", "sk_live_****", "4eC39HqLyjWD"),
    ("sk-proj-" + "Abc123" * 5, "an API token", "sk-proj-****", "Abc123Abc123"),
    ("hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYzAbCdEfGh", "an API token", "hf_****", "AbCdEfGhIj"),
    ("npm_" + "a" * 36, "an API token", "npm_****", "a" * 20),
    ("pypi-AgEIcHlwaS5vcmc" + "x" * 40, "an API token", "pypi-****", "AgEIcHlwaS5vcmc"),
    ("SG." + "a" * 22 + "." + "b" * 43, "an API token", "SG.****", "a" * 20),
]

#: Strings a real manifest holds that must not look like credentials.
HARMLESS = [
    "s3://avsim-scenarios/highway/lane-drop/000396.json",
    "s3://avsim_s3@avsim-artifacts/avsim/week.yaml",
    "registry.example.com/avsim/simulator@sha256:" + "a2adb348" * 8,
    "https://scenarios.example.com:8443/urban/cut-in/000112.json?version=3&tile=12",
    "--duration",
    "--password-file=/run/secrets/db",
    "token bucket rate limiter",
    "tokenizer=bpe",
    "AKIAIOSFODNN7EXAMPL",  # one character short
    "XAKIAIOSFODNN7EXAMPLE",
    "sk-short",
    "Bearer",
    "case-00001",
    "2026-12-06T18:00:00Z",
    "prepare -> simulate -> evaluate -> report",
    "skip-frames",
    "passage=narrow",
]


@pytest.mark.parametrize(
    ("text", "kind", "shown", "secret"), SHAPES, ids=[s[1] + ":" + s[0][:16] for s in SHAPES]
)
def test_a_credential_shape_is_found_and_masked(text: str, kind: str, shown: str | None, secret: str) -> None:
    found = find_secrets(text)
    assert [f.kind for f in found] == [kind]
    if shown is not None:
        assert found[0].masked == shown
    assert MASK in found[0].masked and secret not in found[0].masked
    masked = mask_secrets(text)
    assert secret not in masked and MASK in masked
    assert mask_secrets(masked) == masked  # masking twice changes nothing


@pytest.mark.parametrize("text", HARMLESS)
def test_ordinary_manifest_strings_are_not_credentials(text: str) -> None:
    assert find_secrets(text) == ()
    assert mask_secrets(text) == text


def test_masking_keeps_the_text_around_the_secret() -> None:
    text = "read s3://user:hunter2x@bucket/a and https://h/x?password=abc123&b=1 (then continue)"
    assert (
        mask_secrets(text) == "read s3://user:****@bucket/a and https://h/x?password=****&b=1 (then continue)"
    )


@pytest.mark.parametrize(
    ("key", "sensitive"),
    [
        ("password", True),
        ("DB_PASSWORD", True),
        ("dbPassword", True),
        ("githubToken", True),
        ("GITHUB_TOKEN", True),
        ("api-key", True),
        ("APIKey", True),
        ("aws_secret_access_key", True),
        ("client_secret", True),
        ("private_key", True),
        ("credentials", True),
        ("passphrase", True),
        ("TOKEN_LIMIT", False),
        ("max_tokens", False),
        ("SECRET_NAME", False),
        ("password_file", False),
        ("tokenizer", False),
        ("AWS_ACCESS_KEY_ID", False),
        ("keyframe", False),
        ("primary_key", False),
        ("weather", False),
        ("x" * 500 + "_password", False),  # no name is that long
    ],
)
def test_credential_named_keys(key: str, sensitive: bool) -> None:
    assert is_sensitive_key(key) is sensitive


def test_secret_problems_locate_values_keys_named_values_and_option_arguments() -> None:
    doc = {
        "cases": [
            {"parameters": {"token": "c0ffee-d00d", "use_token": "true", "max_tokens": "4096"}},
            {"scenario": {"uri": "https://me:hunter2x@h/x.json"}},
        ],
        "graphs": {
            "g": {"phases": {"p": {"args": ["--token", "abcd1234", "--password", "-", "--verbose"]}}},
        },
        "AKIAIOSFODNN7EXAMPLE": 1,
    }
    found = dict(secret_problems(doc))
    assert set(found) == {
        ("cases", 0, "parameters", "token"),
        ("cases", 1, "scenario", "uri"),
        ("graphs", "g", "phases", "p", "args", 1),
        ("AKIAIOSFODNN7EXAMPLE",),
    }
    assert found[("cases", 0, "parameters", "token")].startswith("a credential under the key 'token' (****)")
    assert found[("graphs", "g", "phases", "p", "args", 1)].startswith("a credential after '--token' (****)")
    assert found[("AKIAIOSFODNN7EXAMPLE",)].startswith("an AWS access key id in a key (AKIA****)")
    for message in found.values():
        assert message.endswith(USE_A_CONNECTION)
        assert "c0ffee" not in message and "hunter2x" not in message and "abcd1234" not in message


def test_a_sample_week_holds_no_credentials() -> None:
    assert secret_problems(sample_manifest(2_000)) == []


def _doc() -> dict[str, Any]:
    return copy.deepcopy(sample_manifest(3, iso_week="2026-W49"))


def test_the_validator_refuses_a_credential_at_its_path_and_never_repeats_it() -> None:
    doc = _doc()
    doc["graphs"]["standard"]["phases"]["simulate"]["pod"]["env"] = {
        "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMIK7MDENG"
    }
    doc["cases"][2]["scenario"]["uri"] = "https://reader:Tr0ub4dor3@scenarios.example.com/x.json"
    with pytest.raises(ManifestError) as exc:
        validate_manifest(doc, source="week.yaml")
    by_path = {p.path: p.message for p in exc.value.problems}
    assert set(by_path) == {
        "graphs.standard.phases.simulate.pod.env.AWS_SECRET_ACCESS_KEY",
        "cases[2].scenario.uri",
    }
    assert by_path["cases[2].scenario.uri"] == (
        f"a password in a URI (https://reader:****@): {USE_A_CONNECTION}"
    )
    assert "wJalrXUtnFEMI" not in str(exc.value) and "Tr0ub4dor3" not in str(exc.value)


def test_a_credential_in_a_field_of_the_wrong_type_is_masked_in_the_type_error_too() -> None:
    doc = _doc()
    doc["cases"][0]["seed"] = "AKIAIOSFODNN7EXAMPLE"
    with pytest.raises(ManifestError) as exc:
        validate_manifest(doc)
    by_path = {p.path: p.message for p in exc.value.problems if p.path == "cases[0].seed"}
    assert "seed must be an integer, got str 'AKIA****'" in str(exc.value)
    assert "IOSFODNN7EXAMPLE" not in str(exc.value) and by_path


def test_a_credential_as_a_key_is_masked_in_the_path() -> None:
    doc = _doc()
    doc["cases"][1]["parameters"]["s3://me:hunter2x@h"] = 1
    with pytest.raises(ManifestError) as exc:
        validate_manifest(doc)
    assert [p.path for p in exc.value.problems] == ["cases[1].parameters['s3://me:****@h']"]
    assert "hunter2x" not in str(exc.value)


def test_a_file_that_is_no_manifest_is_not_repeated_in_the_error() -> None:
    """Pointed at a credentials file by mistake (or on purpose), the error shows the type, not the text."""
    text = "AWS_ACCESS_KEY_ID=AKIAIOSFODNN7EXAMPLE\nAWS_SECRET_ACCESS_KEY=wJalrXUtnFEMIK7MDENG\n"
    with pytest.raises(ManifestError) as exc:
        parse_manifest_text(text, source="/home/sim/.aws/credentials")
    assert [p.message for p in exc.value.problems] == [
        "a manifest is a mapping (YAML mapping / JSON object) at the top level, got a str"
    ]


def test_the_deployed_catalog_and_the_sample_validate() -> None:
    from avsim.plan.catalog import load_catalog

    load_catalog(ROOT / "dags" / "avsim_graphs.yaml")
    validate_manifest(sample_manifest(50))
