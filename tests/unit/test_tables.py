from pathlib import Path
from types import SimpleNamespace

import pytest
from delta.tables import DeltaTable

from bronze.ddl import column_names
from declaration import Declaration
from pipelines.errors import ConfigError
from pipelines.layers.maintenance import partition_predicate
from pipelines.streaming.delta import snapshot
from pipelines.streaming.tables import (
    Table,
    TableChangeRefusedError,
    clustering_columns,
    declared,
    declared_dimension,
    ensure_table,
)

V1 = Table("gold/t", "id string NOT NULL, n bigint", partitioned_by=("id",))


@pytest.fixture
def conf(base_conf, tmp_path):
    return base_conf.updated({"storage.root": str(tmp_path)})


def test_ddl_column_names_skip_nested_commas():
    ddl = (
        "a string NOT NULL, b decimal(12,2), c map<string,bigint>, d array<struct<k:string,v:int>>"
    )
    assert column_names(ddl) == ["a", "b", "c", "d"]


def test_a_declaration_comes_from_the_module_named_after_its_table():
    orders = declared("silver.orders", "silver/orders")
    assert orders.catalog_name == "silver.orders"
    assert column_names(orders.schema)[:3] == ["order_id", "event_id", "seq"]
    assert orders.properties["delta.enableChangeDataFeed"] == "true"
    assert [kind for kind, _ in orders.expectations][:2] == [
        "expect_column_values_to_not_be_null",
        "expect_column_values_to_be_unique",
    ]


def test_a_declaration_is_one_typed_value_and_anything_else_is_refused_naming_it():
    gaps = declared("bronze.raw_records", "bronze/orders_raw_gaps", attr="GAPS")
    assert column_names(gaps.schema)[:3] == ["topic", "partition", "from_offset"]
    assert declared_dimension("gold.dimensions", "dimensions/products", "products").schema == (
        "product_id string, name string, category string, list_price decimal(12,2)"
    )
    with pytest.raises(ConfigError, match=r"^bronze.raw_records.GAPZ \(for table b/g\): expected"):
        declared("bronze.raw_records", "b/g", attr="GAPZ")
    module = SimpleNamespace(__name__="m", TABLE="a string", DIMENSIONS={"pages": None})
    with pytest.raises(ConfigError, match=r"^m.TABLE \(for table s/t\): .* found a str$"):
        declared(module, "s/t")
    with pytest.raises(ConfigError, match=r"^m.DIMENSIONS declares no dimension 'users' .*'pages'"):
        declared_dimension(module, "d/users", "users")
    with pytest.raises(ConfigError, match=r"^m.DIMENSIONS\['pages'\] .* found None$"):
        declared_dimension(module, "d/pages", "pages")
    with pytest.raises(TypeError, match="unexpected keyword argument 'cluster'"):
        Declaration(schema="a string", cluster=("a",))
    with pytest.raises(TypeError, match=r"cluster_by='a': .* \(one column: \('a',\)\)"):
        Declaration(schema="a string", cluster_by=("a"))
    assert Declaration(schema="a string", zorder_by=["a"]).zorder_by == ("a",)


def test_a_new_nullable_column_and_a_property_are_applied_to_the_table(spark, conf):
    path = ensure_table(spark, conf.table_path(V1.name), V1)
    v2 = Table(
        V1.name, V1.schema + ", note string", V1.partitioned_by, {"delta.appendOnly": "true"}
    )
    assert ensure_table(spark, conf.table_path(v2.name), v2) == path
    assert spark.read.format("delta").load(path).columns == ["id", "n", "note"]
    detail = DeltaTable.forPath(spark, path).detail().first()
    assert detail["properties"]["delta.appendOnly"] == "true"
    versions = DeltaTable.forPath(spark, path).history().count()
    ensure_table(spark, conf.table_path(v2.name), v2)  # nothing left to apply: no new version
    assert DeltaTable.forPath(spark, path).history().count() == versions


def test_a_change_delta_cannot_apply_is_refused_with_the_difference(spark, conf):
    ensure_table(spark, conf.table_path(V1.name), V1)
    changed = Table(V1.name, "id string, n int, extra bigint NOT NULL", partitioned_by=())
    with pytest.raises(TableChangeRefusedError) as e:
        ensure_table(spark, conf.table_path(changed.name), changed)
    assert str(e.value).splitlines()[1:5] == [
        "  column id is NOT NULL, declared NULL",
        "  column n is bigint, declared int",
        "  new column extra is NOT NULL (only nullable ones are added)",
        "  partitioned by ['id'], declared []",
    ]


def test_a_creation_killed_before_its_first_commit_does_not_stop_the_next(spark, conf, tmp_path):
    # what Delta leaves when the job dies between making the log folder and the first commit
    (tmp_path / "gold" / "t" / "_delta_log" / "_staged_commits").mkdir(parents=True)
    path = ensure_table(spark, conf.table_path(V1.name), V1)
    assert spark.read.format("delta").load(path).columns == ["id", "n"]
    assert DeltaTable.forPath(spark, path).history().count() == 1


def test_a_log_folder_holding_a_file_is_never_cleared(spark, conf, tmp_path):
    log = tmp_path / "gold" / "t" / "_delta_log"
    (log / "_staged_commits").mkdir(parents=True)
    (log / "_staged_commits" / "00000000000000000000.uuid.json").write_text("{}")
    with pytest.raises(Exception, match="DELTA_"):
        ensure_table(spark, conf.table_path(V1.name), V1)
    assert (log / "_staged_commits" / "00000000000000000000.uuid.json").read_text() == "{}"


def test_a_layout_delta_refuses_is_refused_where_it_is_declared():
    with pytest.raises(ConfigError, match="table gold/t: cluster_by .* neither partitioned_by"):
        Table("gold/t", "id string, n bigint", partitioned_by=("id",), cluster_by=("n",))
    with pytest.raises(ConfigError, match=r"zorder_by \['id'\]: a partition column already"):
        Table("gold/t", "id string, n bigint", partitioned_by=("id",), zorder_by=("id",))
    assert declared("silver.orders", "silver/orders").cluster_by == ("order_id",)
    events = declared("silver.order_events", "silver/order_events")
    assert (events.partitioned_by, events.zorder_by) == (("event_date",), ("event_id",))


def test_a_declared_clustering_is_applied_to_an_existing_table(spark, conf):
    plain = Table("gold/c", "id string NOT NULL, n bigint")
    path = ensure_table(spark, conf.table_path(plain.name), plain)
    assert clustering_columns(spark, path) == ()
    ensure_table(spark, path, Table(plain.name, plain.schema, cluster_by=("id",)))
    assert clustering_columns(spark, path) == ("id",)
    versions = DeltaTable.forPath(spark, path).history().count()
    ensure_table(spark, path, Table(plain.name, plain.schema, cluster_by=("id",)))
    assert DeltaTable.forPath(spark, path).history().count() == versions
    # read from the version's checksum; without one (a writer that keeps none), from the log
    assert snapshot(spark, path).checksumOpt().get().domainMetadata().isDefined()
    newest = max(Path(path, "_delta_log").glob("*.crc"))
    newest.unlink()
    spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()
    assert not snapshot(spark, path).checksumOpt().isDefined()
    assert clustering_columns(spark, path) == ("id",)


def test_a_partition_predicate_selects_exactly_one_partition():
    assert partition_predicate({"d": "2026-11-25"}, ("d",)) == "(`d` = '2026-11-25')"
    assert partition_predicate({"a": "it's", "b": None}, ("a", "b")) == (
        "(`a` = 'it\\'s' AND `b` IS NULL)"
    )
