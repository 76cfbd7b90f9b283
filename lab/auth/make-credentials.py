#!/usr/bin/env python3
"""Writes the credentials lab/compare-auth.sh and lab/jwt-flood.sh send: a JWKS with one
RSA-2048 key (kid `rs`) and one P-256 key (kid `es`), N distinct valid RS256 and ES256
tokens (one `Bearer TOKEN` line each: distinct `sub`, `exp` a day ahead), N forged RS256
tokens (kid `rs`, valid claims, signed by another RSA key: each costs a full signature
check and fails it), and N API keys (`keys.txt` for the gateway's `keys_file`, their
values one a line for the load generator).
    make-credentials.py DIR [N]
Needs python3's `cryptography` package (Debian's python3-cryptography)."""
import base64, hashlib, json, os, sys, time

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

out, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1000
os.makedirs(out, exist_ok=True)


def b64(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def uint(i: int, size: int) -> str:
    return b64(i.to_bytes(size, "big"))


rs_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
forger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
es_key = ec.generate_private_key(ec.SECP256R1())
rn = rs_key.public_key().public_numbers()
en = es_key.public_key().public_numbers()
jwks = {"keys": [
    {"kty": "RSA", "kid": "rs", "use": "sig", "alg": "RS256", "n": uint(rn.n, 256), "e": uint(rn.e, 3)},
    {"kty": "EC", "kid": "es", "use": "sig", "alg": "ES256", "crv": "P-256",
     "x": uint(en.x, 32), "y": uint(en.y, 32)},
]}
with open(f"{out}/jwks.json", "w") as f:
    json.dump(jwks, f)

now = int(time.time())


def token(alg: str, kid: str, sub: str, sign) -> str:
    head = b64(json.dumps({"alg": alg, "typ": "JWT", "kid": kid}, separators=(",", ":")).encode())
    claims = {"iss": "https://idp.lab/", "aud": "lab-api", "sub": sub, "iat": now, "exp": now + 86400}
    body = b64(json.dumps(claims, separators=(",", ":")).encode())
    signing_input = f"{head}.{body}".encode()
    return f"{head}.{body}.{b64(sign(signing_input))}"


def rs256(key):
    return lambda m: key.sign(m, padding.PKCS1v15(), hashes.SHA256())


def es256(m: bytes) -> bytes:
    r, s = decode_dss_signature(es_key.sign(m, ec.ECDSA(hashes.SHA256())))
    return r.to_bytes(32, "big") + s.to_bytes(32, "big")


with open(f"{out}/rs256.tokens", "w") as f:
    for i in range(n):
        f.write("Bearer " + token("RS256", "rs", f"user-{i}", rs256(rs_key)) + "\n")
with open(f"{out}/es256.tokens", "w") as f:
    for i in range(n):
        f.write("Bearer " + token("ES256", "es", f"user-{i}", es256) + "\n")
with open(f"{out}/forged-rs256.tokens", "w") as f:
    for i in range(n):
        f.write("Bearer " + token("RS256", "rs", f"mallory-{i}", rs256(forger)) + "\n")
with open(f"{out}/keys.txt", "w") as keys, open(f"{out}/api-keys", "w") as values:
    for i in range(n):
        key = f"lab-{i}-{os.urandom(12).hex()}"
        values.write(key + "\n")
        keys.write(f"consumer-{i} sha256:{hashlib.sha256(key.encode()).hexdigest()}\n")
