package lakehouse.storage;

import java.io.IOException;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.Files;
import java.nio.file.StandardCopyOption;
import java.util.Iterator;
import java.util.UUID;

import io.delta.storage.HadoopFileSystemLogStore;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Abortable;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FSDataOutputStreamBuilder;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.PathIOException;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * A Delta log store that is safe with any number of writers, in any number of processes and
 * machines: a commit N.json is created only if nobody created it, atomically, by the store.
 *
 * <p>On an object store (S3 since 2024, S3-compatible servers, GCS, Azure) through Hadoop's
 * conditional create ({@code fs.option.create.conditional.overwrite}: S3A sends
 * {@code If-None-Match: *}); on a local or mounted disk by a hard link, which fails if the name
 * exists. delta-rs commits with the same primitive, so Spark and delta-rs may write one table.
 * A lost race surfaces as {@link FileAlreadyExistsException}: Delta then checks the winner's
 * commit for conflicts and retries, or fails with a conflict; no commit is overwritten.
 *
 * <p>Delta's S3SingleDriverLogStore checks for the file and then writes it, which two drivers
 * can both pass; its LocalLogStore renames, which replaces the file on a POSIX disk.
 */
public class ConditionalPutLogStore extends HadoopFileSystemLogStore {
  static final String CONDITIONAL = "fs.option.create.conditional.overwrite";
  private static final Logger LOG = LoggerFactory.getLogger(ConditionalPutLogStore.class);

  public ConditionalPutLogStore(Configuration initHadoopConf) {
    super(initHadoopConf);
  }

  @Override
  public void write(Path path, Iterator<String> actions, Boolean overwrite, Configuration conf)
      throws IOException {
    byte[] data = join(actions);
    FileSystem fs = path.getFileSystem(conf);
    if (fs instanceof LocalFileSystem || fs instanceof RawLocalFileSystem) {
      try {
        writeLocal(new java.io.File(fs.makeQualified(path).toUri()).toPath(), data, overwrite);
      } catch (FileAlreadyExistsException e) {
        throw taken(path);
      }
      return;
    }
    if (overwrite) {
      try (FSDataOutputStream out = fs.create(path, true)) {
        out.write(data);
      }
      return;
    }
    if (!fs.hasPathCapability(path, CONDITIONAL)) {
      throw new UnsupportedOperationException(
          "the store of " + path + " cannot create a file only if it does not exist ("
              + CONDITIONAL + "): concurrent Delta commits there could overwrite each other. "
              + "On S3 use Hadoop 3.5+ with fs.s3a.create.conditional.enabled=true.");
    }
    FSDataOutputStreamBuilder builder = fs.createFile(path).overwrite(true);
    builder.must(CONDITIONAL, true);
    FSDataOutputStream out = builder.build();
    try {
      out.write(data);
    } catch (IOException | RuntimeException e) {
      ((Abortable) out).abort(); // never publish a partial commit
      throw e;
    }
    try {
      out.close(); // the object appears here, or the store refuses it
    } catch (PathIOException e) {
      if (isPreconditionFailure(e)) {
        throw taken(path);
      }
      throw e;
    }
  }

  private static FileAlreadyExistsException taken(Path path) {
    LOG.info("{} exists: another writer committed this version first (Delta checks it for "
        + "conflicts, then retries or fails)", path);
    return new FileAlreadyExistsException(path.toString());
  }

  private static void writeLocal(java.nio.file.Path target, byte[] data, boolean overwrite)
      throws IOException {
    Files.createDirectories(target.getParent());
    java.nio.file.Path temp =
        target.resolveSibling("." + target.getFileName() + "." + UUID.randomUUID() + ".tmp");
    try {
      try (OutputStream out = Files.newOutputStream(temp)) {
        out.write(data);
      }
      if (overwrite) {
        Files.move(temp, target, StandardCopyOption.REPLACE_EXISTING,
            StandardCopyOption.ATOMIC_MOVE);
      } else {
        Files.createLink(target, temp); // atomic; FileAlreadyExistsException if it exists
      }
    } finally {
      Files.deleteIfExists(temp);
    }
  }

  private static boolean isPreconditionFailure(Throwable e) {
    for (Throwable t = e; t != null; t = t.getCause()) {
      String name = t.getClass().getSimpleName();
      String message = String.valueOf(t.getMessage());
      if (name.equals("RemoteFileChangedException") || message.contains("412")
          || message.contains("PreconditionFailed")) {
        return true;
      }
    }
    return false;
  }

  private static byte[] join(Iterator<String> actions) {
    StringBuilder text = new StringBuilder();
    while (actions.hasNext()) {
      text.append(actions.next());
      if (actions.hasNext()) {
        text.append('\n');
      }
    }
    return text.toString().getBytes(StandardCharsets.UTF_8);
  }

  @Override
  public Boolean isPartialWriteVisible(Path path, Configuration conf) {
    return false; // a commit appears whole, at close or at the link
  }
}
