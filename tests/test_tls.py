"""TCP with TLS and client certificates: a real daemon, real certificates made here."""

from __future__ import annotations

import grpc
import pytest

from decider import YesNo
from decider.client import DeciderClient, RemoteError
from helpers.daemon import free_port, spawn
from helpers.pki import write_pki


def test_tls_with_client_certificates(tmp_path, model_path):
    pki = write_pki(tmp_path)
    address = f"127.0.0.1:{free_port()}"
    trusted = grpc.ssl_channel_credentials(
        root_certificates=pki["ca"].read_bytes(),
        private_key=pki["client_key"].read_bytes(),
        certificate_chain=pki["client_cert"].read_bytes())
    daemon = spawn(tmp_path, "--tls-cert", str(pki["server_cert"]), "--tls-key",
                   str(pki["server_key"]), "--tls-client-ca", str(pki["ca"]),
                   "--n-ctx", "512", address=address, credentials=trusted)
    try:
        with DeciderClient(address, credentials=trusted) as c:
            assert 0 <= c.decide("I was charged twice", [YesNo("Refund?")]).answers[0].p_yes <= 1
        no_client_cert = grpc.ssl_channel_credentials(root_certificates=pki["ca"].read_bytes())
        with DeciderClient(address, credentials=no_client_cert, timeout=5) as c:
            with pytest.raises(RemoteError) as info:
                c.decide("text", [YesNo("ok?")])
            assert info.value.code == grpc.StatusCode.UNAVAILABLE
        with DeciderClient(address, timeout=5) as c:  # plaintext to a TLS port
            with pytest.raises(RemoteError):
                c.decide("text", [YesNo("ok?")])
    finally:
        assert daemon.stop() == 0
