package io.github.sparkpodallocator.spark;

import java.util.List;
import java.util.stream.Collectors;
import java.util.stream.IntStream;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkEnv;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.api.java.JavaSparkContext;

/**
 * The application the README's {@code spark-submit} runs in tests/real_apiserver/chart_pod.rs
 * (through {@code clients/spark/spark-submit.sh}): sums 1..N in four tasks and prints which
 * executors ran them, so the test sees that the executors the service created did the work.
 *
 * <p>Argument: N.
 */
public final class ExampleJob {
  private ExampleJob() {}

  public static void main(String[] args) {
    int n = Integer.parseInt(args[0]);
    try (JavaSparkContext sc = new JavaSparkContext(new SparkConf())) {
      JavaRDD<Integer> numbers =
          sc.parallelize(IntStream.rangeClosed(1, n).boxed().collect(Collectors.toList()), 4);
      long sum = numbers.map(Integer::longValue).reduce(Long::sum);
      List<String> executors =
          numbers.map(i -> SparkEnv.get().executorId()).distinct().collect().stream()
              .sorted()
              .collect(Collectors.toList());
      System.out.println("sum of 1.." + n + " = " + sum + " on executors " + executors);
    }
  }
}
