"""The local cluster's layout and server properties, from configuration alone (no JVM)."""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path

import pytest

from pipelines.config import load_config
from pipelines.local import broker
from pipelines.local.tls import BrokerTls


def cluster(tmp_path: Path, **values):
    return load_config("test").updated(
        {"local_broker.data_dir": str(tmp_path), "local_broker.port": 9192}
        | {"local_broker.controller_port": 9292}
        | values
    )


def properties(text: str) -> dict[str, str]:
    pairs = (ln.split("=", 1) for ln in text.splitlines() if ln and not ln.startswith("#"))
    return dict(pairs)


def test_a_single_node_keeps_its_files_and_its_dynamic_quorum_of_one(tmp_path):
    conf = cluster(tmp_path)
    (node,) = broker.nodes(conf)
    assert (node.id, node.address, node.dir) == (1, "127.0.0.1:9192", tmp_path)
    props = properties(broker._properties(conf, node, [node]))
    assert props["node.id"] == "1"
    assert props["controller.quorum.bootstrap.servers"] == "127.0.0.1:9292"
    assert "controller.quorum.voters" not in props
    assert props["offsets.topic.replication.factor"] == "1"
    assert props["transaction.state.log.min.isr"] == "1"


def test_three_nodes_on_consecutive_ports_form_a_static_quorum_with_replicated_internal_topics(
    tmp_path,
):
    conf = cluster(tmp_path, **{"local_broker.brokers": 3})
    members = broker.nodes(conf)
    assert [(n.id, n.port, n.controller_port, n.dir) for n in members] == [
        (i, 9191 + i, 9291 + i, tmp_path / f"node-{i}") for i in (1, 2, 3)
    ]
    assert broker.addresses(conf) == "127.0.0.1:9192,127.0.0.1:9193,127.0.0.1:9194"
    props = properties(broker._properties(conf, members[1], members))
    assert props["node.id"] == "2"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:9193,CONTROLLER://127.0.0.1:9293"
    assert props["controller.quorum.voters"] == (
        "1@127.0.0.1:9292,2@127.0.0.1:9293,3@127.0.0.1:9294"
    )
    assert props["log.dirs"] == str(tmp_path / "node-2" / "kraft-logs")
    assert props["default.replication.factor"] == "3"
    assert props["offsets.topic.replication.factor"] == "3"
    assert props["transaction.state.log.min.isr"] == "2"


def test_overlapping_port_ranges_are_refused_naming_both_keys(tmp_path):
    conf = cluster(tmp_path, **{"local_broker.brokers": 3, "local_broker.controller_port": 9194})
    members = broker.nodes(conf)
    with pytest.raises(broker.LocalBrokerError, match="local_broker.port .9192. and local_broker"):
        broker._check_ports(conf, members, [None] * 3)


def test_a_secured_node_serves_sasl_ssl_with_scram_and_talks_to_controllers_over_mutual_tls(
    tmp_path,
):
    conf = cluster(
        tmp_path,
        **{
            "local_broker.security_protocol": "SASL_SSL",
            "kafka.security_protocol": "SASL_SSL",
            "kafka.sasl_mechanism": "SCRAM-SHA-512",
            "kafka.sasl_username": "app",
        },
    )
    tls = BrokerTls(tmp_path / "tls")
    tls.dir.mkdir()
    tls.password_file.write_text("store-secret\n")
    sec = broker.Security(tls, "SCRAM-SHA-512", "broker-secret")
    (node,) = broker.nodes(conf)
    props = properties(broker._properties(conf, node, [node], sec))
    assert props["listeners"] == "SASL_SSL://127.0.0.1:9192,CONTROLLER://127.0.0.1:9292"
    assert props["advertised.listeners"] == "SASL_SSL://127.0.0.1:9192"
    assert props["inter.broker.listener.name"] == "SASL_SSL"
    assert props["listener.security.protocol.map"] == "CONTROLLER:SSL,SASL_SSL:SASL_SSL"
    assert props["sasl.enabled.mechanisms"] == "SCRAM-SHA-512"
    assert props["listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config"] == (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="lakehouse-broker" password="broker-secret";'
    )
    assert props["ssl.keystore.location"] == str(tls.keystore)
    assert props["ssl.keystore.password"] == "store-secret"
    assert (props["ssl.truststore.type"], props["ssl.truststore.location"]) == (
        "PEM",
        str(tls.ca_pem),
    )
    assert props["listener.name.controller.ssl.client.auth"] == "required"
    assert "sasl.jaas.config" not in " ".join(k for k in props if not k.startswith("listener."))


def test_the_scram_user_reaches_the_storage_tool_as_kafka_expects_it_salted():
    argument = broker._scram_credential("SCRAM-SHA-512", "app", "the-password")
    match = re.fullmatch(
        r'SCRAM-SHA-512=\[name=app,iterations=8192,salt="([^"]+)",saltedpassword="([^"]+)"\]',
        argument,
    )
    assert match, argument
    salt, salted = (base64.b64decode(g) for g in match.groups())
    assert salted == hashlib.pbkdf2_hmac("sha512", b"the-password", salt, 8192)


@pytest.mark.parametrize(
    ("values", "names"),
    [
        ({"kafka.sasl_mechanism": "PLAIN"}, "kafka.sasl_mechanism"),
        ({"kafka.sasl_username": "lakehouse-broker"}, "kafka.sasl_username"),
        ({"kafka.sasl_username": "a,b"}, "kafka.sasl_username"),
    ],
)
def test_a_secured_broker_refuses_settings_it_cannot_serve_naming_the_key(tmp_path, values, names):
    conf = cluster(
        tmp_path,
        **{
            "local_broker.security_protocol": "SASL_SSL",
            "kafka.sasl_mechanism": "SCRAM-SHA-512",
            "kafka.sasl_username": "app",
        }
        | values,
    )
    with pytest.raises(broker.LocalBrokerError, match=f"{names} in .*test.yaml"):
        broker._security(conf)
