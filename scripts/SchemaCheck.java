// Checks schemas/COMPATIBILITY.md with the official Apache Avro library: every released version of
// every record (schemas/history/v<N>/<Name>.avsc) and the current files, each pair both ways, with
// SchemaCompatibility.checkReaderWriterCompatibility; then prints each current schema's
// SchemaNormalization.parsingFingerprint64 as the 8 little-endian bytes of a single-object header,
// for scripts/schemas-check.sh to compare with the Python codec. Exit 1 on any incompatible pair.
//
//   java -cp 'LIBS/*' scripts/SchemaCheck.java schemas
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.stream.Stream;
import org.apache.avro.Schema;
import org.apache.avro.SchemaCompatibility;
import org.apache.avro.SchemaNormalization;

public class SchemaCheck {
  record Version(String label, Schema schema) {}

  public static void main(String[] args) throws IOException {
    Path root = Path.of(args.length > 0 ? args[0] : "schemas");
    Map<String, List<Version>> byName = new TreeMap<>();
    List<Path> dirs = new ArrayList<>();
    try (Stream<Path> s = Files.list(root.resolve("history"))) {
      s.filter(p -> p.getFileName().toString().matches("v\\d+")).forEach(dirs::add);
    }
    dirs.sort((a, b) -> Integer.compare(num(a), num(b)));
    for (Path d : dirs) add(byName, d, d.getFileName().toString());
    add(byName, root, "current");
    int pairs = 0, bad = 0;
    for (var e : byName.entrySet()) {
      for (Version w : e.getValue()) {
        for (Version r : e.getValue()) {
          var result = SchemaCompatibility.checkReaderWriterCompatibility(r.schema(), w.schema());
          pairs++;
          if (result.getType() != SchemaCompatibility.SchemaCompatibilityType.COMPATIBLE) {
            bad++;
            System.out.printf("INCOMPATIBLE %s: reader %s cannot read writer %s: %s%n", e.getKey(), r.label(),
                w.label(), result.getResult().getIncompatibilities());
          }
        }
      }
    }
    for (var e : byName.entrySet()) {
      List<Version> vs = e.getValue();
      long fp = SchemaNormalization.parsingFingerprint64(vs.get(vs.size() - 1).schema());
      StringBuilder hex = new StringBuilder();
      for (int i = 0; i < 8; i++) hex.append(String.format("%02x", (fp >>> (8 * i)) & 0xff));
      System.out.printf("FINGERPRINT %s %s%n", e.getKey(), hex);
    }
    System.out.printf("%d pairs checked, %d incompatible (%d records, %d versions + current)%n", pairs, bad,
        byName.size(), dirs.size());
    System.exit(bad == 0 ? 0 : 1);
  }

  static int num(Path p) {
    return Integer.parseInt(p.getFileName().toString().substring(1));
  }

  static void add(Map<String, List<Version>> byName, Path dir, String label) throws IOException {
    try (Stream<Path> s = Files.list(dir)) {
      for (Path p : s.filter(f -> f.toString().endsWith(".avsc")).sorted().toList()) {
        String name = p.getFileName().toString().replace(".avsc", "");
        Schema schema = new Schema.Parser().parse(Files.readString(p));
        byName.computeIfAbsent(name, k -> new ArrayList<>()).add(new Version(label, schema));
      }
    }
  }
}
