"""Secrets the redaction tests plant in every input (JUnit, cells.jsonl, rank logs) and look for in every output.

Tokens recognisable by their shape, plus the value of a credential-like environment variable that has no shape at
all: only the environment says it is a secret."""

from __future__ import annotations

SECRET_ENV = "AUTOTP_TEST_SERVICE_PASSWORD"
SECRET_VALUE = "plantedEnvironmentValue42"  # no token shape: redacted only because of the variable's name
SHAPED = (
    "hf_PlantedHuggingFaceToken0123456789abcd",
    "ghp_PlantedClassicToken0123456789abcdefghij",
    "gho_PlantedOAuthToken0123456789abcdefghijkl",
    "ghu_PlantedUserToServer0123456789abcdefghij",
    "ghs_PlantedServerToServer0123456789abcdefgh",
    "github_pat_11PLANTED0123456789_abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTU",
)
BEARER = "PlantedBearerValue.abc-123_XYZ"
AUTHORIZATION = "PlantedAuthorizationValue987"
# Every planted secret, as the outputs must never contain it.
ALL = (SECRET_VALUE, *SHAPED, BEARER, AUTHORIZATION)


def leaky_text() -> str:
    """A failure message that quotes every planted secret, as a careless exception or log line might."""
    return (
        f"HTTPError: 401 for https://huggingface.co (headers: {{'Authorization': 'Bearer {BEARER}'}}) "
        f"Authorization: token {AUTHORIZATION} password={SECRET_VALUE} tokens {' '.join(SHAPED)}"
    )


def leaks(data: bytes | str) -> list[str]:
    """The planted secrets found in data."""
    text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
    return [secret for secret in ALL if secret in text]
