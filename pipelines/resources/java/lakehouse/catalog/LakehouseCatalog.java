package lakehouse.catalog;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.TreeMap;
import java.util.List;
import java.util.Map;
import java.util.TreeSet;

import io.delta.tables.DeltaTable;
import org.apache.spark.sql.catalyst.analysis.NoSuchNamespaceException;
import org.apache.spark.sql.catalyst.analysis.NoSuchTableException;
import org.apache.spark.sql.connector.catalog.Identifier;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.delta.catalog.DeltaCatalog;
import org.apache.spark.sql.internal.SQLConf;
import scala.jdk.javaapi.CollectionConverters;

/**
 * Spark's session catalog with every table the lakehouse declares reachable by name, as
 * {@code <schema>.<table>} (e.g. {@code silver.orders}), where its data already lives.
 *
 * <p>Delta's catalog with one addition: a name the session's settings declare ({@code
 * spark.lakehouse.table.<schema>.<table>=<path>}) loads the Delta table at that path, as {@code
 * delta.`<path>`} would. There is no metastore: nothing to start, nothing to lock, any number of
 * drivers at once, and the names follow the configuration (read at each lookup: a session may
 * point them at another root). Every other name goes to the session catalog as before (views,
 * temporary tables, tables a user creates).
 */
public class LakehouseCatalog extends DeltaCatalog {
  public static final String PREFIX = "spark.lakehouse.table.";

  /** Declared name (lower case) -> path, from the active session's settings. */
  private static Map<String, String> tables() {
    Map<String, String> tables = new TreeMap<>();
    Map<String, String> all = CollectionConverters.asJava(SQLConf.get().getAllConfs());
    for (Map.Entry<String, String> e : all.entrySet()) {
      if (e.getKey().startsWith(PREFIX)) {
        tables.put(e.getKey().substring(PREFIX.length()).toLowerCase(), e.getValue());
      }
    }
    return tables;
  }

  /** The declared path of {@code ident}, or null if it is not a declared table. */
  private String pathOf(Identifier ident) {
    if (ident.namespace().length != 1) {
      return null;
    }
    return tables().get((ident.namespace()[0] + "." + ident.name()).toLowerCase());
  }

  private static Identifier atPath(String path) {
    return Identifier.of(new String[] {"delta"}, path);
  }

  /** Scala's methods declare no checked exception: throw Spark's own "no such table". */
  @SuppressWarnings("unchecked")
  private static <E extends Throwable> RuntimeException sneaky(Throwable e) throws E {
    throw (E) e;
  }

  @Override
  public Table loadTable(Identifier ident) {
    String path = pathOf(ident);
    if (path == null) {
      return super.loadTable(ident);
    }
    // Delta loads a path lazily: a table not created yet would fail only when read
    if (!DeltaTable.isDeltaTable(path)) {
      throw LakehouseCatalog.<RuntimeException>sneaky(new NoSuchTableException(ident));
    }
    return super.loadTable(atPath(path));
  }

  @Override
  public Table loadTable(Identifier ident, long timestamp) {
    String path = pathOf(ident);
    return super.loadTable(path == null ? ident : atPath(path), timestamp);
  }

  @Override
  public Table loadTable(Identifier ident, String version) {
    String path = pathOf(ident);
    return super.loadTable(path == null ? ident : atPath(path), version);
  }

  @Override
  public boolean tableExists(Identifier ident) {
    String path = pathOf(ident);
    return path == null ? super.tableExists(ident) : DeltaTable.isDeltaTable(path);
  }

  private TreeSet<String> schemas() {
    TreeSet<String> names = new TreeSet<>();
    for (String key : tables().keySet()) {
      names.add(key.substring(0, key.indexOf('.')));
    }
    return names;
  }

  @Override
  public Identifier[] listTables(String[] namespace) throws NoSuchNamespaceException {
    List<Identifier> found = new ArrayList<>();
    boolean declared = namespace.length == 1 && schemas().contains(namespace[0].toLowerCase());
    if (declared) {
      String schema = namespace[0].toLowerCase();
      for (String key : tables().keySet()) {
        Identifier ident = Identifier.of(namespace, key.substring(key.indexOf('.') + 1));
        if (key.startsWith(schema + ".") && tableExists(ident)) {
          found.add(ident);
        }
      }
    }
    if (!declared || super.namespaceExists(namespace)) {
      found.addAll(Arrays.asList(super.listTables(namespace)));
    }
    return found.toArray(new Identifier[0]);
  }

  @Override
  public String[][] listNamespaces() throws NoSuchNamespaceException {
    TreeSet<String> names = schemas();
    for (String[] ns : super.listNamespaces()) {
      names.add(String.join(".", ns));
    }
    return names.stream().map(n -> new String[] {n}).toArray(String[][]::new);
  }

  @Override
  public boolean namespaceExists(String[] namespace) {
    return (namespace.length == 1 && schemas().contains(namespace[0].toLowerCase()))
        || super.namespaceExists(namespace);
  }

  @Override
  public Map<String, String> loadNamespaceMetadata(String[] namespace)
      throws NoSuchNamespaceException {
    if (namespace.length == 1 && schemas().contains(namespace[0].toLowerCase())
        && !super.namespaceExists(namespace)) {
      return Map.of("comment", "the lakehouse's " + namespace[0] + " tables");
    }
    return super.loadNamespaceMetadata(namespace);
  }
}
