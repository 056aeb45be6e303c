# Shared by scripts/kafka.sh and scripts/cluster.sh (sourced, not run).

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
