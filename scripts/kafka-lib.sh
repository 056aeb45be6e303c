# Shared by scripts/kafka.sh and scripts/cluster.sh (sourced, not run).

# internal_topics REPLICATION MIN_ISR OFFSETS_PARTITIONS: the broker settings of Kafka's own topics
# (and the few defaults every node here shares), as server.properties lines.
internal_topics() {
  cat <<PROPS
offsets.topic.replication.factor=$1
offsets.topic.num.partitions=$3
transaction.state.log.replication.factor=$1
transaction.state.log.min.isr=$2
share.coordinator.state.topic.replication.factor=$1
share.coordinator.state.topic.min.isr=$2
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
log.retention.hours=-1
PROPS
}

# write_log4j DIR: the node's log4j2 configuration in DIR, logging to DIR/kafka-server.log.
write_log4j() {
  cat > "$1/log4j2.properties" <<L4J
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = $1/kafka-server.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.state.name = state.change.logger
logger.state.level = WARN
L4J
}
