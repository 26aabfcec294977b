"""S3Store from outside, as a production user meets it: one call after another, two
processes (two stores) on one prefix, a store beside a saver, a cut or a retried request
between two calls; each case in both index modes on moto, equal to InMemoryStore where
LangGraph defines the answer, or a named error with nothing stored."""

from __future__ import annotations

import pytest
from test_store_s3 import _stored, bucket, make_store  # noqa: F401  (bucket: a fixture)

from s3_saver.errors import ConfigurationError


def test_a_ttl_past_what_a_timestamp_holds_is_refused_and_stores_nothing(bucket: tuple[str, str]) -> None:
    """A ttl whose expiry no index can hold (the bucket's documents keep 64-bit microsecond
    counts; DynamoDB numbers and Python's datetime stop earlier) is a ConfigurationError
    naming namespace and key, raised before anything is sent: the namespace is not even
    registered. The longest ttl accepted is stored and read back."""
    ns = ("users", "ann")
    with make_store(*bucket, ttl={"default_ttl": 5}) as store:
        for ttl in (1e12, 1e300):
            with pytest.raises(ConfigurationError, match=r"put of key 'k' in namespace \('users', 'ann'\): ttl must be"):
                store.put(ns, "k", {"v": 1}, ttl=ttl)
        assert _stored(bucket) == [] and store.list_namespaces() == []
        store.put(ns, "k", {"v": 1}, ttl=1e9)
        assert store.get(ns, "k").value == {"v": 1} and store.list_namespaces() == [ns]
    with pytest.raises(ConfigurationError, match=r"ttl\['default_ttl'\] must be"):
        make_store(*bucket, ttl={"default_ttl": 1e12})
