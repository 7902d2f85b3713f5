"""problem+json bodies are pure ASCII, so a client that guesses the charset still reads them.

Found by schemathesis: a body key "\\u0081\\"..." came back in `detail` and `errors[].field`;
sent as UTF-8 without a charset parameter, requests' fallback guessed a Japanese code page,
in which the byte after \\xc2\\x81 swallowed the escaping backslash: invalid JSON.
"""

import json

from gateway.kit.errors import FieldError, problem_response


def test_a_field_name_with_control_characters_and_quotes_survives_any_charset_guess():
    name = 'body.\u0081"\U00010040'
    r = problem_response(422, "Invalid request", detail=f"invalid fields: {name}",
                         errors=[FieldError(field=name, message="Extra inputs are not permitted", type="extra")])
    assert r.headers["content-type"] == "application/problem+json"
    assert r.body.isascii()
    for charset in ("utf-8", "cp932", "latin-1"):
        body = json.loads(r.body.decode(charset))
        assert body["errors"][0]["field"] == name and body["detail"].endswith(name)
