package watchproxy.testclients;

import java.io.FileOutputStream;
import java.io.FileDescriptor;
import java.io.IOException;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.time.Instant;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * One JSON line per event on stdout, in the format of tests/clients/go's watchclient:
 * {@code {"type":"ADDED","namespace":"ns","name":"cm-1","resourceVersion":"12","informer":3,
 * "at":1765000000123456000}}, where {@code at} is the wall-clock time the line was made (Unix
 * nanoseconds, microsecond precision): when the handler ran, as the Python programs stamp theirs.
 * Types: ADDED, MODIFIED, DELETED (handler calls), SYNC (an update whose resourceVersion did not
 * change: a relist or a resync delivered it), READY (every informer synced), WATCH_ERROR and
 * ERROR (the client reported a failure). Each line is one write to the file descriptor, made
 * under a lock: a reader sees whole lines as soon as they are handled, and a killed process
 * loses nothing it printed.
 */
public final class Lines {
  private static final OutputStream OUT = new FileOutputStream(FileDescriptor.out);

  private Lines() {}

  /** A handler call on {@code informer} for an object with this metadata. */
  public static void object(String type, int informer, String namespace, String name, String rv) {
    object(type, informer, namespace, name, rv, false);
  }

  /**
   * As above; {@code tombstone} marks a delete the informer inferred from a relist (the
   * object's last state unknown), as the Go program marks it.
   */
  public static void object(
      String type, int informer, String namespace, String name, String rv, boolean tombstone) {
    Map<String, Object> line = new LinkedHashMap<>();
    line.put("type", type);
    line.put("namespace", namespace);
    line.put("name", name);
    line.put("resourceVersion", rv);
    line.put("informer", informer);
    line.put("tombstone", tombstone ? Boolean.TRUE : null);
    write(line);
  }

  /** ADDED, MODIFIED or SYNC for an update, as the Go informer program tells them apart. */
  public static String updateType(String oldRv, String newRv) {
    return oldRv != null && oldRv.equals(newRv) ? "SYNC" : "MODIFIED";
  }

  public static void marker(String type) {
    Map<String, Object> line = new LinkedHashMap<>();
    line.put("type", type);
    write(line);
  }

  public static void error(String type, int informer, Throwable error) {
    Map<String, Object> line = new LinkedHashMap<>();
    line.put("type", type);
    line.put("informer", informer);
    line.put("error", String.valueOf(error));
    write(line);
  }

  public static void write(Map<String, Object> fields) {
    Instant now = Instant.now();
    fields.put("at", now.getEpochSecond() * 1_000_000_000L + now.getNano());
    StringBuilder out = new StringBuilder("{");
    boolean first = true;
    for (Map.Entry<String, Object> field : fields.entrySet()) {
      if (field.getValue() == null) {
        continue;
      }
      if (!first) {
        out.append(',');
      }
      first = false;
      quote(out, field.getKey());
      out.append(':');
      if (field.getValue() instanceof Number || field.getValue() instanceof Boolean) {
        out.append(field.getValue());
      } else {
        quote(out, String.valueOf(field.getValue()));
      }
    }
    out.append("}\n");
    byte[] bytes = out.toString().getBytes(StandardCharsets.UTF_8);
    synchronized (OUT) {
      try {
        OUT.write(bytes);
      } catch (IOException gone) {
        // The reader is gone (the test ended): nothing useful is left to do.
        Runtime.getRuntime().halt(0);
      }
    }
  }

  private static void quote(StringBuilder out, String text) {
    out.append('"');
    for (int i = 0; i < text.length(); i++) {
      char c = text.charAt(i);
      switch (c) {
        case '"' -> out.append("\\\"");
        case '\\' -> out.append("\\\\");
        case '\n' -> out.append("\\n");
        case '\r' -> out.append("\\r");
        case '\t' -> out.append("\\t");
        default -> {
          if (c < 0x20) {
            out.append(String.format("\\u%04x", (int) c));
          } else {
            out.append(c);
          }
        }
      }
    }
    out.append('"');
  }
}
