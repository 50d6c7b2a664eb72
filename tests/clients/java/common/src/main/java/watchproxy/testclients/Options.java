package watchproxy.testclients;

import java.util.Arrays;

/**
 * The command line both programs share:
 * {@code [--namespace NS] [--informers N] [--resource configmaps|pods] [--http-only]}. The
 * kubeconfig comes from KUBECONFIG, as each library's default configuration reads it.
 */
public final class Options {
  /** The namespace to watch; null: the kubeconfig context's. */
  public String namespace;
  /** How many informers on the same objects the program runs, each with its own list+watch. */
  public int informers = 1;
  /**
   * What the informers watch: {@code configmaps} (the default) or {@code pods}, for a test that
   * writes and records pods.
   */
  public String resource = "configmaps";
  /** fabric8 only: HTTP watches instead of its default WebSocket ones. */
  public boolean httpOnly;

  public static Options parse(String[] args, String usage) {
    Options options = new Options();
    for (int i = 0; i < args.length; i++) {
      switch (args[i]) {
        case "--namespace" -> options.namespace = value(args, ++i, usage);
        case "--informers" -> options.informers = Integer.parseInt(value(args, ++i, usage));
        case "--resource" -> options.resource = value(args, ++i, usage);
        case "--http-only" -> options.httpOnly = true;
        default -> fail("unknown argument " + args[i] + " in " + Arrays.toString(args), usage);
      }
    }
    if (options.informers < 1) {
      fail("--informers must be at least 1", usage);
    }
    if (!options.resource.equals("configmaps") && !options.resource.equals("pods")) {
      fail("--resource must be configmaps or pods, not " + options.resource, usage);
    }
    return options;
  }

  private static String value(String[] args, int i, String usage) {
    if (i >= args.length) {
      fail(args[i - 1] + " needs a value", usage);
    }
    return args[i];
  }

  private static void fail(String why, String usage) {
    System.err.println(why + "\nusage: " + usage);
    System.exit(2);
  }
}
