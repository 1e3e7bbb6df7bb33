package lakehouse.json;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;
import com.fasterxml.jackson.core.StreamReadFeature;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.spark.sql.api.java.UDF2;

/**
 * SQL function {@code lakehouse_flat_object(value binary, fields string) -> array<string>}: the
 * texts of the fields of a raw JSON value in the order {@code fields} names them, when the value is
 * exactly one JSON object with those fields, each once and of its kind; else null. Other fields
 * may be there, with any plain JSON in them.
 *
 * <p>{@code fields} is {@code name:kind,...}, a kind one of {@code string} (a JSON string, given
 * decoded), {@code integer} (a JSON integer of at most 64 bits, given as written) and {@code number}
 * (a JSON number of at most 38 digits without exponent, given as written). Nothing but JSON
 * whitespace may follow the object.
 *
 * <p>A fast path, not a judge: one streaming pass of Jackson over the bytes, where Spark's own
 * functions parse the value several times. Null means "not the common shape"; the caller then
 * takes its field-by-field checks, which say what is wrong. So this refuses whatever it is not
 * sure reads as Spark reads it: a value that is not plainly UTF-8 (a byte order mark, a zero byte,
 * which Jackson would read as another encoding), a string or name with a UTF-16 surrogate (an
 * escaped lone one is not text), any number form but the plain ones, a value over 4 MiB or nested
 * over 32 deep. A name repeated at any depth makes the value invalid JSON, as it does to Spark.
 */
public class FlatObject implements UDF2<byte[], String, String[]> {
  // A repeated name at any depth is an error, as it is to Spark's parse into a VARIANT.
  private static final JsonFactory JSON =
      JsonFactory.builder().enable(StreamReadFeature.STRICT_DUPLICATE_DETECTION).build();
  private static final int MAX_BYTES = 4 << 20; // well below a VARIANT's 16 MiB
  private static final int MAX_DEPTH = 32;
  private static final ConcurrentHashMap<String, Spec> SPECS = new ConcurrentHashMap<>();
  private static final int STRING = 0, INTEGER = 1, NUMBER = 2;

  /** The names and kinds of {@code fields}. */
  private static final class Spec {
    final String[] names;
    final int[] kinds;

    Spec(String fields) {
      String[] parts = fields.split(",");
      names = new String[parts.length];
      kinds = new int[parts.length];
      for (int i = 0; i < parts.length; i++) {
        String[] nameKind = parts[i].trim().split(":");
        if (nameKind.length != 2) {
          throw new IllegalArgumentException("lakehouse_flat_object: '" + parts[i] + "' is not name:kind");
        }
        names[i] = nameKind[0];
        switch (nameKind[1]) {
          case "string": kinds[i] = STRING; break;
          case "integer": kinds[i] = INTEGER; break;
          case "number": kinds[i] = NUMBER; break;
          default:
            throw new IllegalArgumentException(
                "lakehouse_flat_object: kind '" + nameKind[1] + "' is not string, integer or number");
        }
      }
    }

    int index(String name) {
      for (int i = 0; i < names.length; i++) if (names[i].equals(name)) return i;
      return -1;
    }
  }

  @Override
  public String[] call(byte[] value, String fields) {
    if (value == null || fields == null || !plainBytes(value)) return null;
    Spec spec = SPECS.computeIfAbsent(fields, Spec::new);
    String[] out = new String[spec.names.length];
    int seen = 0;
    try (JsonParser p = JSON.createParser(value)) {
      if (p.nextToken() != JsonToken.START_OBJECT) return null;
      JsonToken t;
      while ((t = p.nextToken()) == JsonToken.FIELD_NAME) {
        String name = p.currentName();
        int i = spec.index(name);
        JsonToken v = p.nextToken();
        if (i < 0) { // a field the caller does not name: allowed, when plainly read as Spark reads it
          if (!plainText(name) || !plainValue(p, v, 0)) return null;
          continue;
        }
        String text = read(p, v, spec.kinds[i]);
        if (text == null) return null;
        out[i] = text;
        seen++;
      }
      if (t != JsonToken.END_OBJECT || seen != out.length || p.nextToken() != null) return null;
    } catch (Exception e) { // not JSON, or something after the object: not the common shape
      return null;
    }
    return out;
  }

  /** Whether the value at `v` (skipped) holds only strings without surrogates, booleans, nulls,
   * integers of at most 64 bits and plain numbers of at most 38 digits, at most MAX_DEPTH deep. */
  private static boolean plainValue(JsonParser p, JsonToken v, int depth) throws Exception {
    if (v == JsonToken.START_OBJECT || v == JsonToken.START_ARRAY) {
      if (depth >= MAX_DEPTH) return false;
      JsonToken end = v == JsonToken.START_OBJECT ? JsonToken.END_OBJECT : JsonToken.END_ARRAY;
      JsonToken t;
      while ((t = p.nextToken()) != end) {
        if (t == JsonToken.FIELD_NAME) {
          if (!plainText(p.currentName())) return false;
          t = p.nextToken();
        }
        if (!plainValue(p, t, depth + 1)) return false;
      }
      return true;
    }
    switch (v) {
      case VALUE_TRUE: case VALUE_FALSE: case VALUE_NULL: return true;
      case VALUE_STRING: return read(p, v, STRING) != null;
      case VALUE_NUMBER_INT: return read(p, v, INTEGER) != null;
      case VALUE_NUMBER_FLOAT: return read(p, v, NUMBER) != null;
      default: return false;
    }
  }

  private static boolean plainText(String s) {
    for (int k = 0; k < s.length(); k++) if (Character.isSurrogate(s.charAt(k))) return false;
    return true;
  }

  /** The value's text when its token is of `kind`, else null. */
  private static String read(JsonParser p, JsonToken v, int kind) throws Exception {
    switch (kind) {
      case STRING:
        if (v != JsonToken.VALUE_STRING) return null;
        String s = p.getText();
        return plainText(s) ? s : null;
      case INTEGER:
        if (v != JsonToken.VALUE_NUMBER_INT) return null;
        JsonParser.NumberType type = p.getNumberType();
        return type == JsonParser.NumberType.INT || type == JsonParser.NumberType.LONG
            ? p.getText()
            : null;
      default:
        if (v != JsonToken.VALUE_NUMBER_INT && v != JsonToken.VALUE_NUMBER_FLOAT) return null;
        String n = p.getText();
        int digits = 0;
        for (int k = 0; k < n.length(); k++) {
          char c = n.charAt(k);
          if (c == 'e' || c == 'E') return null;
          if (c >= '0' && c <= '9') digits++;
        }
        return digits <= 38 ? n : null;
    }
  }

  /** Whether Jackson reads `value` as UTF-8: it starts with `{` or JSON whitespace (no byte order
   * mark) and has no zero byte (by which Jackson detects UTF-16 and UTF-32). */
  private static boolean plainBytes(byte[] value) {
    if (value.length == 0 || value.length > MAX_BYTES) return false;
    byte first = value[0];
    if (first != '{' && first != ' ' && first != '\t' && first != '\n' && first != '\r') return false;
    for (byte b : value) if (b == 0) return false;
    return true;
  }
}
