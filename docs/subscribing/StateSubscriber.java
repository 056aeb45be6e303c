// A subscriber of effects.state in Java, on the official Apache Avro library and kafka-clients only:
// decodes single-object-encoded records with today's EffectState.avsc as the reader schema, and
// learns the writer schema of any record written by a newer release from the compacted
// effects.schemas topic (key: the 8 fingerprint bytes of the record header as hex; value: the
// writer schema's JSON). Run (Java 17+, avro 1.12 and kafka-clients on the class path):
//
//   java -cp 'libs/*' StateSubscriber.java BOOTSTRAP PREFIX path/to/EffectState.avsc [COUNT]
//
// Prints one line per state record: key, state, version. Exits after COUNT records (or 60 s).
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.UUID;
import org.apache.avro.Schema;
import org.apache.avro.SchemaNormalization;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.message.BinaryMessageDecoder;
import org.apache.avro.message.SchemaStore;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.StringDeserializer;

public class StateSubscriber {
  /** A SchemaStore that reads effects.schemas when it meets a fingerprint it does not know. */
  static final class TopicSchemaStore implements SchemaStore {
    private final Map<Long, Schema> known = new HashMap<>();
    private final KafkaConsumer<String, String> consumer;

    TopicSchemaStore(Properties props, String topic) {
      consumer = new KafkaConsumer<>(props, new StringDeserializer(), new StringDeserializer());
      List<TopicPartition> parts =
          consumer.partitionsFor(topic).stream().map(p -> new TopicPartition(topic, p.partition())).toList();
      consumer.assign(parts);
      consumer.seekToBeginning(parts);
    }

    void add(Schema schema) {
      known.put(SchemaNormalization.parsingFingerprint64(schema), schema);
    }

    @Override
    public synchronized Schema findByFingerprint(long fingerprint) {
      if (!known.containsKey(fingerprint)) {
        readToEnd(Duration.ofSeconds(10)); // the writer published it before its first record
      }
      return known.get(fingerprint); // null: BinaryMessageDecoder throws MissingSchemaException
    }

    private void readToEnd(Duration wait) {
      Map<TopicPartition, Long> end = consumer.endOffsets(consumer.assignment());
      long deadline = System.nanoTime() + wait.toNanos();
      while (System.nanoTime() < deadline
          && end.entrySet().stream().anyMatch(e -> consumer.position(e.getKey()) < e.getValue())) {
        for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(200))) {
          Schema schema = new Schema.Parser().parse(r.value());
          long fp = SchemaNormalization.parsingFingerprint64(schema);
          // The key is the header's 8 bytes (little-endian) as hex: check it names this schema.
          if (String.format("%016x", Long.reverseBytes(fp)).equals(r.key())) {
            known.put(fp, schema);
          }
        }
      }
    }
  }

  public static void main(String[] args) throws Exception {
    String bootstrap = args[0], prefix = args[1];
    Schema reader = new Schema.Parser().parse(Files.readString(Path.of(args[2])));
    int count = args.length > 3 ? Integer.parseInt(args[3]) : Integer.MAX_VALUE;
    Properties props = new Properties();
    props.put("bootstrap.servers", bootstrap);
    props.put("group.id", "state-subscriber-" + UUID.randomUUID());
    props.put("auto.offset.reset", "earliest");

    TopicSchemaStore store = new TopicSchemaStore(props, prefix + "effects.schemas");
    store.add(reader);
    BinaryMessageDecoder<GenericRecord> decoder = new BinaryMessageDecoder<>(GenericData.get(), reader, store);
    try (KafkaConsumer<String, byte[]> c =
        new KafkaConsumer<>(props, new StringDeserializer(), new ByteArrayDeserializer())) {
      c.subscribe(List.of(prefix + "effects.state"));
      int seen = 0;
      long deadline = System.nanoTime() + Duration.ofSeconds(60).toNanos();
      while (seen < count && System.nanoTime() < deadline) {
        for (ConsumerRecord<String, byte[]> r : c.poll(Duration.ofMillis(500))) {
          if (r.value() == null) {
            continue; // a tombstone: the effect was retired
          }
          GenericRecord state = decoder.decode(r.value());
          System.out.println(r.key() + " " + state.get("state") + " " + state.get("version"));
          seen++;
        }
      }
    }
  }
}
