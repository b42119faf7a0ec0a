package io.fusedcomm.api;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.lang.reflect.Executable;
import java.lang.reflect.Field;
import java.lang.reflect.GenericArrayType;
import java.lang.reflect.Method;
import java.lang.reflect.Modifier;
import java.lang.reflect.ParameterizedType;
import java.lang.reflect.Type;
import java.lang.reflect.WildcardType;
import java.net.URISyntaxException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.stream.Stream;
import org.junit.jupiter.api.Test;

/**
 * The public API (the plugin entry, {@code api}, {@code errors}, {@code spark}, {@code config})
 * hands out and takes only public types: nothing of the bootstrap records, the executor runtime
 * or the plugin's internals, which can change freely (and a bootstrap record carries a share of
 * the communicator's key).
 */
class PublicApiTest {
  private static final List<String> PUBLIC_PACKAGES =
      List.of("io.fusedcomm", "io.fusedcomm.api", "io.fusedcomm.errors", "io.fusedcomm.spark", "io.fusedcomm.config");

  @Test
  void publicSignaturesUseOnlyPublicTypes() throws Exception {
    List<String> leaks = new ArrayList<>();
    List<Class<?>> classes = publicClasses();
    assertTrue(classes.contains(Communicator.class) && classes.contains(DeviceTensor.class), classes.toString());
    for (Class<?> c : classes) {
      List<Executable> members = new ArrayList<>(List.of(c.getDeclaredConstructors()));
      members.addAll(List.of(c.getDeclaredMethods()));
      for (Executable e : members) {
        if (!visible(e.getModifiers()) || e.isSynthetic()) {
          continue;
        }
        List<Type> types = new ArrayList<>(List.of(e.getGenericParameterTypes()));
        if (e instanceof Method m) {
          types.add(m.getGenericReturnType());
        }
        for (Type t : types) {
          check(t, c.getSimpleName() + "." + e.getName(), leaks);
        }
      }
      for (Field f : c.getDeclaredFields()) {
        if (visible(f.getModifiers())) {
          check(f.getGenericType(), c.getSimpleName() + "." + f.getName(), leaks);
        }
      }
    }
    assertEquals(List.of(), leaks, "public members that expose internal types");
  }

  @Test
  void internalsAreNotReachable() throws Exception {
    assertTrue(!Modifier.isPublic(Communicator.class.getDeclaredMethod("ranks").getModifiers()));
    assertTrue(!Modifier.isPublic(Communicator.class.getDeclaredMethod("hosts").getModifiers()));
    assertTrue(Stream.of(Communicator.class.getDeclaredMethods())
        .noneMatch(m -> m.getName().equals("bootstrap")), "bootstrap lives in CommBootstrap");
  }

  private static boolean visible(int modifiers) {
    return Modifier.isPublic(modifiers) || Modifier.isProtected(modifiers);
  }

  private static void check(Type t, String where, List<String> leaks) {
    if (t instanceof Class<?> c) {
      while (c.isArray()) {
        c = c.getComponentType();
      }
      if (c.isPrimitive()) {
        return;
      }
      String pkg = c.getPackageName();
      if (pkg.startsWith("io.fusedcomm") && (!PUBLIC_PACKAGES.contains(pkg) || !Modifier.isPublic(c.getModifiers()))) {
        leaks.add(where + " uses " + c.getName());
      }
    } else if (t instanceof ParameterizedType p) {
      check(p.getRawType(), where, leaks);
      for (Type a : p.getActualTypeArguments()) {
        check(a, where, leaks);
      }
    } else if (t instanceof GenericArrayType g) {
      check(g.getGenericComponentType(), where, leaks);
    } else if (t instanceof WildcardType w) {
      for (Type b : w.getUpperBounds()) {
        check(b, where, leaks);
      }
      for (Type b : w.getLowerBounds()) {
        check(b, where, leaks);
      }
    }
  }

  /** The public classes of the public packages, from the compiled classes folder. */
  private static List<Class<?>> publicClasses() throws IOException, URISyntaxException, ClassNotFoundException {
    Path root = Path.of(Communicator.class.getProtectionDomain().getCodeSource().getLocation().toURI());
    List<Class<?>> out = new ArrayList<>();
    for (String pkg : PUBLIC_PACKAGES) {
      Path dir = root.resolve(pkg.replace('.', '/'));
      try (Stream<Path> files = Files.list(dir)) {
        for (Path f : files.filter(p -> p.toString().endsWith(".class")).toList()) {
          String name = f.getFileName().toString();
          Class<?> c = Class.forName(pkg + "." + name.substring(0, name.length() - 6), false,
              PublicApiTest.class.getClassLoader());
          if (Modifier.isPublic(c.getModifiers()) && (c.getEnclosingClass() == null
              || Modifier.isPublic(c.getEnclosingClass().getModifiers()))) {
            out.add(c);
          }
        }
      }
    }
    return out;
  }
}
