// Hadoop's local file system, minus one process per file written.
//
// pyspark ships no native Hadoop library, so RawLocalFileSystem.setPermission forks `chmod` for
// every file and directory it creates: every checkpoint file (offsets, commits, and each state
// partition's delta, with its .crc) cost a process, 8 per micro-batch on the critical path
// (docs/decisions/0006-no-fork-local-fs.md). java.nio sets the same mode bits without one.
// Built by streaming/engine/local_fs.py; selected with spark.hadoop.fs.file.impl.
package txstream.hadoop;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;
import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

public class NoForkLocalFileSystem extends LocalFileSystem {
  public NoForkLocalFileSystem() {
    super(new Raw());
  }

  /** The raw file system under the checksums: only setPermission differs. */
  public static class Raw extends RawLocalFileSystem {
    // Bit i of a POSIX mode, from the lowest (others' execute) up.
    private static final PosixFilePermission[] BITS = {
      PosixFilePermission.OTHERS_EXECUTE, PosixFilePermission.OTHERS_WRITE,
      PosixFilePermission.OTHERS_READ, PosixFilePermission.GROUP_EXECUTE,
      PosixFilePermission.GROUP_WRITE, PosixFilePermission.GROUP_READ,
      PosixFilePermission.OWNER_EXECUTE, PosixFilePermission.OWNER_WRITE,
      PosixFilePermission.OWNER_READ,
    };

    @Override
    public void setPermission(Path p, FsPermission permission) throws IOException {
      int mode = permission.toShort();
      Set<PosixFilePermission> perms = EnumSet.noneOf(PosixFilePermission.class);
      for (int i = 0; i < BITS.length; i++) {
        if ((mode & (1 << i)) != 0) {
          perms.add(BITS[i]);
        }
      }
      Files.setPosixFilePermissions(pathToFile(p).toPath(), perms);
    }
  }
}
