package io.github.sparkpodallocator.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.Optional;
import org.apache.spark.SparkConf;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

class ServiceSettingsTest {
  @TempDir Path dir;

  private Path missing() {
    return dir.resolve("no-token");
  }

  private static SparkConf conf() {
    return new SparkConf(false).set(ServiceSettings.ADDRESS, "allocator.spark.svc:50051");
  }

  @Test
  void theAddressIsRequiredAndTheErrorNamesTheKey() {
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
        () -> ServiceSettings.fromConf(new SparkConf(false), missing()));
    assertTrue(e.getMessage().contains("spark.kubernetes.allocation.service.address"),
        e.getMessage());
  }

  @Test
  void aUrlIsNotAnAddress() {
    SparkConf conf = conf().set(ServiceSettings.ADDRESS, "http://allocator:50051");
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
        () -> ServiceSettings.fromConf(conf, missing()));
    assertTrue(e.getMessage().startsWith(ServiceSettings.ADDRESS), e.getMessage());
  }

  @Test
  void defaults() {
    ServiceSettings settings = ServiceSettings.fromConf(conf(), missing());
    assertEquals("allocator.spark.svc:50051", settings.address());
    assertFalse(settings.tls());
    assertEquals(Optional.empty(), settings.tokenFile());
    assertEquals(Duration.ofSeconds(10), settings.deadline());
    assertEquals(Duration.ofSeconds(60), settings.retryTimeout());
    assertFalse(settings.isDeletedWhenUnavailable());
    assertEquals(Duration.ofSeconds(10), settings.checkInterval());
    assertTrue(settings.executorEvents());
  }

  @Test
  void theServiceAccountTokenIsSentWhenPresentUnlessTurnedOff() throws IOException {
    Path token = Files.writeString(dir.resolve("token"), "abc\n");
    assertEquals(Optional.of(token), ServiceSettings.fromConf(conf(), token).tokenFile());
    SparkConf off = conf().set(ServiceSettings.TOKEN_FILE, "");
    assertEquals(Optional.empty(), ServiceSettings.fromConf(off, token).tokenFile());
  }

  @Test
  void anExplicitTokenFileMustExist() throws IOException {
    Path own = Files.writeString(dir.resolve("own"), "xyz");
    assertEquals(Optional.of(own), ServiceSettings.fromConf(
        conf().set(ServiceSettings.TOKEN_FILE, own.toString()), missing()).tokenFile());
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
        () -> ServiceSettings.fromConf(
            conf().set(ServiceSettings.TOKEN_FILE, dir.resolve("absent").toString()), missing()));
    assertTrue(e.getMessage().startsWith(ServiceSettings.TOKEN_FILE), e.getMessage());
  }

  @Test
  void tlsFilesTurnTlsOnAndACertificateNeedsItsKey() throws IOException {
    Path ca = Files.writeString(dir.resolve("ca.pem"), "-");
    Path cert = Files.writeString(dir.resolve("cert.pem"), "-");
    Path key = Files.writeString(dir.resolve("key.pem"), "-");
    ServiceSettings withCa =
        ServiceSettings.fromConf(conf().set(ServiceSettings.TLS_CA_FILE, ca.toString()), missing());
    assertTrue(withCa.tls());
    assertEquals(Optional.of(ca), withCa.caFile());

    ServiceSettings mutual = ServiceSettings.fromConf(conf()
        .set(ServiceSettings.TLS_CERT_FILE, cert.toString())
        .set(ServiceSettings.TLS_KEY_FILE, key.toString()), missing());
    assertTrue(mutual.tls());
    assertEquals(Optional.of(key), mutual.keyFile());

    IllegalArgumentException alone = assertThrows(IllegalArgumentException.class,
        () -> ServiceSettings.fromConf(
            conf().set(ServiceSettings.TLS_CERT_FILE, cert.toString()), missing()));
    assertTrue(alone.getMessage().contains(ServiceSettings.TLS_KEY_FILE), alone.getMessage());

    IllegalArgumentException off = assertThrows(IllegalArgumentException.class,
        () -> ServiceSettings.fromConf(conf()
            .set(ServiceSettings.TLS_ENABLED, "false")
            .set(ServiceSettings.TLS_CA_FILE, ca.toString()), missing()));
    assertTrue(off.getMessage().startsWith(ServiceSettings.TLS_ENABLED), off.getMessage());

    assertTrue(ServiceSettings.fromConf(conf().set(ServiceSettings.TLS_ENABLED, "true"),
        missing()).tls());
  }

  @Test
  void durationsInSparksSyntax() {
    ServiceSettings settings = ServiceSettings.fromConf(conf()
        .set(ServiceSettings.DEADLINE, "2s")
        .set(ServiceSettings.RETRY_TIMEOUT, "1min")
        .set(ServiceSettings.IS_DELETED_WHEN_UNAVAILABLE, "TRUE")
        .set(ServiceSettings.CHECK_INTERVAL, "3s"), missing());
    assertEquals(Duration.ofSeconds(3), settings.checkInterval());
    assertEquals(Duration.ofSeconds(2), settings.deadline());
    assertEquals(Duration.ofMinutes(1), settings.retryTimeout());
    assertTrue(settings.isDeletedWhenUnavailable());
    assertEquals(Duration.ofMillis(250), ServiceSettings.fromConf(
        conf().set(ServiceSettings.DEADLINE, "250"), missing()).deadline());
  }

  @Test
  void badValuesNameTheirKey() {
    for (String[] bad : new String[][] {
        {ServiceSettings.DEADLINE, "soon"},
        {ServiceSettings.DEADLINE, "0s"},
        {ServiceSettings.RETRY_TIMEOUT, "-1s"},
        {ServiceSettings.CHECK_INTERVAL, "0"},
        {ServiceSettings.TLS_ENABLED, "yes"},
        {ServiceSettings.IS_DELETED_WHEN_UNAVAILABLE, "maybe"},
    }) {
      IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
          () -> ServiceSettings.fromConf(conf().set(bad[0], bad[1]), missing()), bad[0]);
      assertTrue(e.getMessage().startsWith(bad[0]), e.getMessage());
    }
  }

  @Test
  void executorEventsCanBeTurnedOffAndTheKeyIsNamedWhenInvalid() {
    assertFalse(ServiceSettings.fromConf(
        conf().set(ServiceSettings.EXECUTOR_EVENTS, "false"), missing()).executorEvents());
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
        () -> ServiceSettings.fromConf(conf().set(ServiceSettings.EXECUTOR_EVENTS, "yes"),
            missing()));
    assertTrue(e.getMessage().startsWith(ServiceSettings.EXECUTOR_EVENTS), e.getMessage());
  }
}
